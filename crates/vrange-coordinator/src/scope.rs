//! What the coordinator watches: a memory cgroup (v2 `memory.pressure` PSI and
//! `memory.current` against `memory.max`/`memory.high`; v1 vmpressure and
//! `memory.usage_in_bytes` against `memory.limit_in_bytes`) or the whole machine
//! (`/proc/pressure/memory` and `MemAvailable` against `MemTotal`).

use std::io;
use std::os::fd::RawFd;
use std::path::PathBuf;
use vrange_sys::cgroup::MemCgroup;
use vrange_sys::pressure::{psi_window_us, Headroom, Level, PsiTrigger, VmPressure};

/// What a coordinator is responsible for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// A memory cgroup (its directory) and everything below it.
    Cgroup(PathBuf),
    /// The whole machine.
    Machine,
}

/// A pressure event that wakes the coordinator before its next tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// A PSI trigger (the machine's or the cgroup's) fired.
    Psi,
    /// cgroup v1 vmpressure "medium".
    Medium,
    /// cgroup v1 vmpressure "critical".
    Critical,
}

/// The open pressure sources of a scope.
pub struct Watch {
    pub cgroup: Option<MemCgroup>,
    headroom: Option<Headroom>,
    psi: Vec<PsiTrigger>,
    vmpressure: Vec<VmPressure>,
}

/// PSI trigger: 100 ms of "some" stall within 2 s (a window unprivileged processes may ask).
const PSI_STALL_US: u64 = 100_000;
const PSI_WINDOW_US: u64 = 2_000_000;

impl Watch {
    /// Opens the scope's sources. A cgroup without a memory controller is an error; missing
    /// PSI or vmpressure only leaves the coordinator polling the headroom each tick.
    ///
    /// # Errors
    /// NotFound when `Scope::Cgroup` names no memory cgroup; the errno of opening its files.
    pub fn open(scope: &Scope) -> io::Result<Watch> {
        let window = psi_window_us(PSI_WINDOW_US);
        match scope {
            Scope::Machine => Ok(Watch {
                cgroup: None,
                headroom: None,
                psi: PsiTrigger::system(PSI_STALL_US, window, false)
                    .into_iter()
                    .collect(),
                vmpressure: Vec::new(),
            }),
            Scope::Cgroup(path) => {
                let cg = MemCgroup::at(path).ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::NotFound,
                        format!("{} is not a memory cgroup", path.display()),
                    )
                })?;
                let headroom = Headroom::new(&cg)?;
                let psi = cg
                    .pressure_file()
                    .and_then(|f| PsiTrigger::file(&f, PSI_STALL_US, window, false).ok())
                    .into_iter()
                    .collect();
                let vmpressure = [Level::Medium, Level::Critical]
                    .into_iter()
                    .filter_map(|l| VmPressure::register(&cg, l).ok())
                    .collect();
                Ok(Watch {
                    cgroup: Some(cg),
                    headroom,
                    psi,
                    vmpressure,
                })
            }
        }
    }

    /// The descriptors to poll and what each means.
    pub fn fds(&self) -> Vec<(RawFd, Event)> {
        let psi = self.psi.iter().map(|t| (t.fd(), Event::Psi));
        let vmp = self.vmpressure.iter().map(|v| {
            (
                v.fd(),
                match v.level() {
                    Level::Critical => Event::Critical,
                    _ => Event::Medium,
                },
            )
        });
        psi.chain(vmp).collect()
    }

    /// Whether `fd` is a PSI trigger (polled for POLLPRI, not drained).
    pub fn is_psi(&self, fd: RawFd) -> bool {
        self.psi.iter().any(|t| t.fd() == fd)
    }

    /// Drains a vmpressure eventfd that fired.
    pub fn drain(&self, fd: RawFd) {
        for v in self.vmpressure.iter().filter(|v| v.fd() == fd) {
            v.take_events();
        }
    }

    /// (headroom, ceiling) in bytes now: the cgroup's limit (the lower of `memory.max` and
    /// `memory.high` on v2) minus its usage, or the machine's `MemAvailable` and `MemTotal`.
    /// `None` for a cgroup without a limit (pressure events alone then drive purges).
    pub fn headroom(&mut self) -> Option<(u64, u64)> {
        match (&self.cgroup, self.headroom.as_mut()) {
            (None, _) => {
                // One read of /proc/meminfo for both.
                let (total, avail) = vrange_sys::procfs::mem_available_kb().ok()??;
                Some((avail.saturating_mul(1024), total.saturating_mul(1024)))
            }
            (Some(_), Some(h)) => {
                let _ = h.refresh_ceiling();
                Some((h.bytes().ok()?, h.ceiling()))
            }
            (Some(cg), None) => {
                // A limit set after the start.
                self.headroom = Headroom::new(cg).ok().flatten();
                let h = self.headroom.as_ref()?;
                Some((h.bytes().ok()?, h.ceiling()))
            }
        }
    }

    /// Bytes charged to the cgroup now, or for the machine MemTotal less MemAvailable.
    pub fn usage(&self) -> Option<u64> {
        match &self.cgroup {
            Some(cg) => cg.usage().ok(),
            None => {
                let (total, avail) = vrange_sys::procfs::mem_available_kb().ok()??;
                Some(total.saturating_sub(avail).saturating_mul(1024))
            }
        }
    }

    /// OOM kills in the cgroup so far (`None` for the machine or where the kernel has no
    /// counter).
    pub fn oom_kills(&self) -> Option<u64> {
        self.cgroup.as_ref()?.oom_kills().ok()
    }
}
