//! The sources the thread listens to (PSI triggers, vmpressure, the headroom file) and when
//! it opens them.

use super::config;
use super::ACTIVE;
use crate::stats;
use crate::stats::Source;
use std::sync::atomic::Ordering::Acquire;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use vrange_sys::cgroup;
use vrange_sys::cgroup::MemCgroup;
use vrange_sys::fd::Ident;
use vrange_sys::pressure::Headroom as HeadroomFile;
use vrange_sys::pressure::Level;
use vrange_sys::pressure::Poller;
use vrange_sys::pressure::PsiTrigger;
use vrange_sys::pressure::Signal;
use vrange_sys::pressure::VmPressure;

/// The sources the thread listens to for one cgroup and one configuration.
pub(super) struct Watch {
    pub(super) poller: Poller,
    pub(super) cgroup: Option<MemCgroup>,
    pub(super) headroom: Option<HeadroomFile>,
    pub(super) _psi: Vec<PsiTrigger>,
    pub(super) _vmpressure: Vec<VmPressure>,
    pub(super) version: u64,
}

impl Watch {
    pub(super) fn open(waker: Option<Ident>) -> Watch {
        let cfg = config::get();
        let version = cfg.version.load(Acquire);
        let mut poller = Poller::new();
        let mut active = sources_without_descriptors();
        if let Some(w) = waker {
            let _ = poller.add(w, Signal::Wake);
        }
        let cgroup = MemCgroup::current();
        let mut psi = Vec::new();
        let kind = cfg.psi_kind.load(Relaxed);
        if kind != 0 {
            let (stall, window) = (
                cfg.psi_stall_us.load(Relaxed),
                vrange_sys::pressure::psi_window_us(cfg.psi_window_us.load(Relaxed)),
            );
            if let Ok(t) = PsiTrigger::system(stall, window, kind == 2) {
                if poller.add(t.ident(), Signal::PsiSystem).is_ok() {
                    active |= 1 << Source::Psi as u8;
                    psi.push(t);
                }
            }
            // The v2 directory's memory.pressure works even where memory is on v1.
            if let Some(Ok(t)) = cgroup::v2_pressure_file()
                .map(|file| PsiTrigger::file(&file, stall, window, kind == 2))
            {
                if poller.add(t.ident(), Signal::PsiCgroup).is_ok() {
                    active |= 1 << Source::PsiCgroup as u8;
                    psi.push(t);
                }
            }
        }
        let mut vmpressure = Vec::new();
        if cfg.vmpressure.load(Relaxed) {
            for (level, source) in [
                (Level::Medium, Source::VmpressureMedium),
                (Level::Critical, Source::VmpressureCritical),
            ] {
                if let Some(Ok(v)) = cgroup
                    .as_ref()
                    .map(|cg| VmPressure::register_own(cg, level))
                {
                    if poller.add(v.ident(), v.signal()).is_ok() {
                        active |= 1 << source as u8;
                        vmpressure.push(v);
                    }
                }
            }
        }
        let headroom = match (&cgroup, cfg.headroom.load(Relaxed)) {
            (Some(cg), setting) if setting != 0 => HeadroomFile::new(cg).ok().flatten(),
            _ => None,
        };
        if headroom.is_some() {
            active |= 1 << Source::Headroom as u8;
        }
        ACTIVE.store(active, Relaxed);
        Watch {
            poller,
            cgroup,
            headroom,
            _psi: psi,
            _vmpressure: vmpressure,
            version,
        }
    }

    /// Follows a changed limit (or a limit set on a cgroup that had none).
    pub(super) fn refresh_limits(&mut self) {
        match (&mut self.headroom, &self.cgroup) {
            (Some(h), _) => {
                let _ = h.refresh_ceiling();
            }
            (None, Some(cg)) if config::get().headroom.load(Relaxed) != 0 => {
                self.headroom = HeadroomFile::new(cg).ok().flatten();
                if self.headroom.is_some() {
                    ACTIVE.fetch_or(1 << Source::Headroom as u8, Relaxed);
                }
            }
            _ => {}
        }
    }

    /// Whether the process moved to another cgroup, the settings changed, or the program
    /// closed or replaced one of the descriptors (then the sources are reopened).
    pub(super) fn stale(&mut self) -> bool {
        let moved = MemCgroup::current().map(|c| c.path().to_path_buf())
            != self.cgroup.as_ref().map(|c| c.path().to_path_buf());
        let lost = !self.poller.check().is_empty()
            || self.headroom.as_ref().is_some_and(|h| !h.is_intact())
            || self._vmpressure.iter().any(|v| !v.is_intact());
        moved || lost || self.version != config::get().version.load(Acquire)
    }
}

/// Whether the thread needs its sources now: the process has had volatile memory (or a shared
/// region, volatile in other processes' eyes too) for a whole tick. `since` is when the thread first saw it (reset when it goes). A process that lives
/// less than a tick, or frees memory only briefly, never holds a descriptor of vrange's; the
/// budget and explicit purges need none.
pub(super) fn needs_sources(since: &mut Option<u64>, now: u64, tick: Duration) -> bool {
    if stats::volatile_resident() == 0 && !crate::managed::maps_shared() {
        *since = None;
        return false;
    }
    let first = *since.get_or_insert(now);
    now.saturating_sub(first) >= tick.as_nanos() as u64
}

/// The sources that work before (and without) any descriptor: explicit purges, and the budget
/// when one is set.
pub(super) fn sources_without_descriptors() -> u8 {
    let budget = config::get().budget.load(Relaxed) != 0;
    (1 << Source::Explicit as u8) | (u8::from(budget) << Source::Budget as u8)
}
