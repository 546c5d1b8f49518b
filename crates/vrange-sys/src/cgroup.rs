//! Memory cgroups: discovery of this process's memory cgroup (v1 and v2), reading its limit,
//! usage and pressure files, and creating and removing child memory cgroups for tests and
//! demos.
//!
//! It never writes settings to a cgroup it did not create: the only writes outside its own
//! children are the ones needed to manage them (enabling the v2 memory controller for children
//! of the parent, and moving processes back to the parent before removal). It never leaves a
//! child cgroup behind: [`ChildCgroup`]'s `Drop` removes the directory, and says on stderr
//! which one it could not remove.
//!
//! Mount points come from /proc/self/mountinfo, so hierarchies mounted somewhere other than
//! /sys/fs/cgroup are found too.

use crate::unavailable::Unavailable;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Which cgroup hierarchy a [`MemCgroup`] lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// The legacy hierarchy with a `memory` controller of its own.
    V1,
    /// The unified hierarchy.
    V2,
}

/// A memory cgroup, named by its absolute directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemCgroup {
    version: Version,
    path: PathBuf,
}

/// v1 reports "no limit" as a huge page-rounded number rather than a keyword.
pub(crate) const V1_UNLIMITED: u64 = 1 << 62;

/// Rmdir attempts and the pause between them: a process that just exited stays charged to the
/// cgroup (EBUSY) until the kernel finishes tearing it down.
const RMDIR_ATTEMPTS: u32 = 100;
const RMDIR_PAUSE: Duration = Duration::from_millis(10);

impl MemCgroup {
    /// This process's memory cgroup, or `None` if it has none that can be read.
    ///
    /// A v1 memory hierarchy wins when one is mounted and /proc/self/cgroup names this process's
    /// place in it; otherwise the v2 cgroup is used if the memory controller is enabled for it
    /// (its `memory.current` exists, which is never the case for the v2 root).
    pub fn current() -> Option<MemCgroup> {
        discover().ok()
    }

    /// The memory cgroup at directory `path`: v1 if it has `memory.limit_in_bytes`, v2 if it
    /// has `memory.current`; `None` otherwise (not a cgroup, or no memory controller).
    pub fn at(path: &Path) -> Option<MemCgroup> {
        let version = if path.join("memory.limit_in_bytes").exists() {
            Version::V1
        } else if path.join("memory.current").exists() {
            Version::V2
        } else {
            return None;
        };
        Some(MemCgroup {
            version,
            path: path.to_path_buf(),
        })
    }

    /// The memory cgroup of process `pid` (as [`MemCgroup::current`] finds this process's,
    /// through this process's view of the mounts).
    pub fn of_process(pid: u32) -> Option<MemCgroup> {
        discover_for(&format!("/proc/{pid}/cgroup")).ok()
    }

    /// Whether `other` is this cgroup or lies below it.
    pub fn contains(&self, other: &MemCgroup) -> bool {
        self.version == other.version && other.path.starts_with(&self.path)
    }

    /// The hierarchy this cgroup lives in.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The cgroup's absolute directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The path of one of the cgroup's control files.
    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    /// The hard memory limit in bytes, or `None` if unlimited or unreadable.
    pub fn limit(&self) -> Option<u64> {
        match self.version {
            Version::V1 => read_u64(&self.file("memory.limit_in_bytes"))
                .ok()
                .filter(|&v| v < V1_UNLIMITED),
            Version::V2 => read_limit_v2(&self.file("memory.max")),
        }
    }

    /// The v2 throttling threshold (`memory.high`) in bytes; `None` if unlimited, unreadable or
    /// on v1, which has no such knob.
    pub fn high(&self) -> Option<u64> {
        match self.version {
            Version::V1 => None,
            Version::V2 => read_limit_v2(&self.file("memory.high")),
        }
    }

    /// Bytes the cgroup can still take before anything but page cache must go: the lower of
    /// the hard limit and (v2) `memory.high`, minus usage, plus the page cache the kernel
    /// drops first and cheaply (clean page cache, not shared memory; see `memory.stat`); 0 when
    /// over; `None` when neither limit is set or a file cannot be read. Without a limit the
    /// machine's MemAvailable counts the same way.
    ///
    /// Cost: three (v1) or four (v2) control-file reads, each an open, read and close
    /// with a path and a string allocated, some microseconds. A loop that asks often should
    /// hold a [`super::pressure::Headroom`] instead: two preads, nothing allocated.
    pub fn headroom(&self) -> Option<u64> {
        let ceiling = match (self.limit(), self.high()) {
            (Some(limit), Some(high)) => limit.min(high),
            (limit, high) => limit.or(high)?,
        };
        let cache = crate::fd::read_file(self.file("memory.stat"))
            .map_or(0, |stat| reclaimable_file(stat.as_bytes(), self.version));
        Some(headroom(ceiling, self.usage().ok()?, cache))
    }

    /// Bytes currently charged to the cgroup.
    pub fn usage(&self) -> io::Result<u64> {
        read_u64(&self.file(match self.version {
            Version::V1 => "memory.usage_in_bytes",
            Version::V2 => "memory.current",
        }))
    }

    /// How many processes the OOM killer has killed in this cgroup.
    pub fn oom_kills(&self) -> io::Result<u64> {
        let path = self.file(match self.version {
            Version::V1 => "memory.oom_control",
            Version::V2 => "memory.events",
        });
        let text = crate::fd::read_file(&path)?;
        keyed_value(&text, "oom_kill").ok_or_else(|| {
            // Kernels before 4.13 have no oom_kill counter in v1.
            invalid_data(format!("no oom_kill line in {}", path.display()))
        })
    }

    /// The PSI file (`memory.pressure`) of a v2 cgroup, if the kernel provides one.
    pub fn pressure_file(&self) -> Option<PathBuf> {
        match self.version {
            Version::V1 => None,
            Version::V2 => Some(self.file("memory.pressure")).filter(|p| p.exists()),
        }
    }

    /// Asks the kernel to reclaim `bytes` from the cgroup (v2 `memory.reclaim`, Linux 5.19+):
    /// without swap, page cache alone. Unsupported on v1, which has no such file.
    ///
    /// # Errors
    /// Unsupported on v1 or a kernel without the file; EAGAIN when the kernel reclaimed less
    /// than asked (it tried); the errno of writing otherwise.
    pub fn reclaim(&self, bytes: u64) -> io::Result<()> {
        let file = self.file("memory.reclaim");
        if self.version == Version::V1 || !file.exists() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "no memory.reclaim (cgroup v1, or a kernel before 5.19)",
            ));
        }
        write_file(&file, &bytes.to_string())
    }

    /// Whether these credentials may create a child of this cgroup that has memory files of its
    /// own (what [`MemCgroup::create_child`] needs), and if not, why, in words.
    ///
    /// Judged with `faccessat(AT_EACCESS)` (effective ids and capabilities, read-only mounts) on
    /// the directory and, on v2, on `cgroup.subtree_control`, plus the v2 rules for enabling a
    /// controller, rather than by creating and removing a child: this runs inside other
    /// people's programs (`vrange::features()`, `vrange_features()`), where even a short-lived
    /// cgroup is a visible side effect (service managers see a foreign cgroup) and enabling a
    /// controller for the parent would outlive the probe.
    pub fn may_create_child(&self) -> Result<(), Unavailable> {
        let denied = |path: &Path, e: io::Error| match e.raw_os_error() {
            Some(libc::EACCES | libc::EPERM) => Unavailable::from_io(&e),
            _ => Unavailable::from_io(&e).within(path.display()),
        };
        access(&self.path, libc::W_OK | libc::X_OK).map_err(|e| denied(&self.path, e))?;
        if self.version == Version::V1 {
            return Ok(());
        }
        let has_memory = |file: &str| {
            crate::fd::read_file(self.file(file))
                .is_ok_and(|t| t.split_whitespace().any(|c| c == "memory"))
        };
        if has_memory("cgroup.subtree_control") {
            return Ok(());
        }
        if !has_memory("cgroup.controllers") {
            return Err(Unavailable::because(format!(
                "the memory controller is not available in {}",
                self.path.display()
            )));
        }
        let control = self.file("cgroup.subtree_control");
        access(&control, libc::W_OK).map_err(|e| denied(&control, e))?;
        // The v2 "no internal processes" rule: a cgroup with member processes cannot enable a
        // controller for its children.
        if crate::fd::read_file(self.file("cgroup.procs")).is_ok_and(|t| !t.trim().is_empty()) {
            return Err(Unavailable::because(format!(
                "{} has member processes, so cgroup v2 cannot enable memory for its children",
                self.path.display()
            )));
        }
        Ok(())
    }

    /// Creates the child cgroup `name` with a hard limit of `limit` bytes and swap kept out of
    /// the picture as far as the hierarchy allows.
    ///
    /// `name` must be a single path component; [`unique_name`] makes one that no concurrent
    /// caller will pick. A directory of that name left by an earlier crashed run is removed
    /// first. On any failure after the directory is made, it is removed again.
    pub fn create_child(&self, name: &str, limit: u64) -> io::Result<ChildCgroup> {
        if name.is_empty() || name == "." || name == ".." || name.contains(['/', '\0']) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("cgroup name {name:?} is not a single path component"),
            ));
        }
        let dir = self.path.join(name);
        if dir.exists() {
            // Leftover from a crashed run; if it is still busy, mkdir below reports it.
            let _ = fs::remove_dir(&dir);
        }
        if self.version == Version::V2 {
            // Without this the child has no memory.* files. The write fails if the parent
            // holds processes itself or its own parent does not delegate memory; the check
            // after mkdir then reports that.
            let control = self.file("cgroup.subtree_control");
            let enabled = crate::fd::read_file(&control)
                .map(|t| t.split_whitespace().any(|c| c == "memory"))
                .unwrap_or(false);
            if !enabled {
                let _ = write_file(&control, "+memory");
            }
        }
        fs::create_dir(&dir)?;
        // From here on, dropping `child` removes the directory, also on the error paths.
        let child = ChildCgroup {
            cg: MemCgroup {
                version: self.version,
                path: dir,
            },
        };
        match self.version {
            Version::V1 => {
                // Best effort: there is usually no swap anyway, and old kernels refuse this
                // under a hierarchical parent.
                let _ = write_file(&child.cg.file("memory.swappiness"), "0");
            }
            Version::V2 => {
                if !child.cg.file("memory.max").exists() {
                    return Err(io::Error::new(
                        io::ErrorKind::Unsupported,
                        format!(
                            "memory controller not enabled in {}",
                            self.file("cgroup.subtree_control").display()
                        ),
                    ));
                }
                let swap_max = child.cg.file("memory.swap.max");
                if swap_max.exists() {
                    write_file(&swap_max, "0")?;
                }
            }
        }
        child.set_limit(limit)?;
        Ok(child)
    }
}

/// A memory cgroup this process created; dropping it removes the directory.
#[derive(Debug)]
pub struct ChildCgroup {
    cg: MemCgroup,
}

impl ChildCgroup {
    /// The cgroup itself, for reading its files.
    pub fn cgroup(&self) -> &MemCgroup {
        &self.cg
    }

    /// Moves process `pid` (all its threads) into this cgroup.
    pub fn add_pid(&self, pid: i32) -> io::Result<()> {
        write_file(&self.cg.file("cgroup.procs"), &pid.to_string())
    }

    /// Sets the hard memory limit. Fails with EBUSY on v1 if usage cannot be reclaimed below
    /// the new limit.
    pub fn set_limit(&self, bytes: u64) -> io::Result<()> {
        let name = match self.cg.version {
            Version::V1 => "memory.limit_in_bytes",
            Version::V2 => "memory.max",
        };
        write_file(&self.cg.file(name), &bytes.to_string())
    }

    /// Moves every process still in this cgroup to the parent, ignoring failures (a process may
    /// exit meanwhile).
    fn evacuate(&self) {
        let Some(parent) = self.cg.path.parent() else {
            return;
        };
        let Ok(procs) = crate::fd::read_file(self.cg.file("cgroup.procs")) else {
            return;
        };
        let parent_procs = parent.join("cgroup.procs");
        // On v2 a parent that enables controllers for its children may hold no process
        // (EBUSY): then this process's own cgroup, which holds one already.
        let own_procs = || Some(own_v2_dir(true)?.join("cgroup.procs"));
        for pid in procs.split_whitespace() {
            // cgroup.procs takes exactly one pid per write.
            if write_file(&parent_procs, pid).is_err() && self.cg.version == Version::V2 {
                if let Some(own) = own_procs() {
                    let _ = write_file(&own, pid);
                }
            }
        }
    }
}

impl Drop for ChildCgroup {
    fn drop(&mut self) {
        let mut last_err = None;
        for attempt in 0..RMDIR_ATTEMPTS {
            if attempt > 0 {
                std::thread::sleep(RMDIR_PAUSE);
            }
            // Again on every attempt: a process in the cgroup may have forked meanwhile.
            self.evacuate();
            match fs::remove_dir(&self.cg.path) {
                Ok(()) => return,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return,
                Err(e) => last_err = Some(e),
            }
        }
        if let Some(e) = last_err {
            eprintln!("vrange: left cgroup {} behind: {e}", self.cg.path.display());
        }
    }
}

/// Makes the child `cmd` spawns join the cgroup whose `cgroup.procs` file is `procs` between
/// fork and exec, so that everything the new program faults in is charged there (cgroup v1
/// does not move charges with a process). Writing "0" moves the writer itself.
///
/// # Errors
/// Opening `procs` for writing; the write itself fails the spawn.
pub fn join_before_exec(cmd: &mut std::process::Command, procs: &Path) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    // Opened here (close-on-exec), written in the child: between fork and exec only system
    // calls are allowed.
    let file = OpenOptions::new().write(true).open(procs)?;
    // SAFETY: the hook only calls write(2) on a descriptor the closure keeps open, and builds
    // an io::Error from errno without allocating.
    unsafe {
        cmd.pre_exec(move || {
            if libc::write(file.as_raw_fd(), b"0".as_ptr().cast(), 1) == 1 {
                Ok(())
            } else {
                Err(io::Error::last_os_error())
            }
        });
    }
    Ok(())
}

/// `faccessat(2)` with the effective ids (`AT_EACCESS`).
fn access(path: &Path, mode: libc::c_int) -> io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: c is a NUL-terminated path; faccessat only reads it.
    let rc = unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), mode, libc::AT_EACCESS) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// A cgroup name no other call in this process returns: `prefix`, the pid, and a counter.
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}{}-{n}", std::process::id())
}

/// The `memory.pressure` file of this process's cgroup v2 directory, for a per-cgroup PSI
/// trigger. It exists whenever PSI is enabled, even where the v2 memory controller is not (as
/// on hosts that keep memory on v1). `None` for the v2 root, whose file is the system-wide one
/// (`/proc/pressure/memory`), or without a cgroup2 mount.
pub fn v2_pressure_file() -> Option<PathBuf> {
    let file = own_v2_dir(false)?.join("memory.pressure");
    file.exists().then_some(file)
}

/// This process's cgroup v2 directory (the v2 root included), if cgroup2 is mounted and
/// /proc/self/cgroup has a v2 line: where a v2 cgroup of this process's would be made.
pub fn v2_dir() -> Option<PathBuf> {
    own_v2_dir(true)
}

/// This process's cgroup v2 directory (the root only if `root_too`), if cgroup2 is mounted.
fn own_v2_dir(root_too: bool) -> Option<PathBuf> {
    let proc_cgroup = crate::fd::read_file("/proc/self/cgroup").ok()?;
    let (_, v2_path) = parse_proc_cgroup(&proc_cgroup);
    let v2_path = v2_path.filter(|p| root_too || p != "/")?;
    let mounts = match fs::read("/proc/self/mountinfo") {
        Ok(bytes) => parse_mountinfo(&String::from_utf8_lossy(&bytes)),
        Err(_) => CgroupMounts::fallback(),
    };
    mounts.v2?.dir_of(&v2_path)
}

/// Finds this process's memory cgroup, or says why there is none.
fn discover() -> Result<MemCgroup, Unavailable> {
    discover_for("/proc/self/cgroup")
}

fn discover_for(file: &str) -> Result<MemCgroup, Unavailable> {
    let proc_cgroup = crate::fd::read_file(file)
        .map_err(|e| Unavailable::from_io(&e).within(format_args!("cannot read {file}")))?;
    let (v1_path, v2_path) = parse_proc_cgroup(&proc_cgroup);
    let mounts = match fs::read("/proc/self/mountinfo") {
        Ok(bytes) => parse_mountinfo(&String::from_utf8_lossy(&bytes)),
        Err(_) => CgroupMounts::fallback(),
    };

    let mut reasons = Vec::new();
    match (&mounts.v1_memory, &v1_path) {
        (Some(mount), Some(path)) => match mount.dir_of(path) {
            Some(dir) if dir.join("memory.limit_in_bytes").exists() => {
                return Ok(MemCgroup {
                    version: Version::V1,
                    path: dir,
                })
            }
            Some(dir) => reasons.push(format!("v1: {} has no memory files", dir.display())),
            None => reasons.push(format!("v1: {path} is outside the mounted subtree")),
        },
        (None, _) => reasons.push("v1: no memory hierarchy mounted".to_string()),
        (Some(_), None) => reasons.push("v1: /proc/self/cgroup has no memory line".to_string()),
    }
    match (&mounts.v2, &v2_path) {
        (Some(mount), Some(path)) => match mount.dir_of(path) {
            Some(dir) if dir.join("memory.current").exists() => {
                return Ok(MemCgroup {
                    version: Version::V2,
                    path: dir,
                })
            }
            Some(dir) => reasons.push(format!(
                "v2: {} has no memory.current (root cgroup or controller not enabled)",
                dir.display()
            )),
            None => reasons.push(format!("v2: {path} is outside the mounted subtree")),
        },
        (None, _) => reasons.push("v2: no cgroup2 mount".to_string()),
        (Some(_), None) => reasons.push("v2: /proc/self/cgroup has no 0:: line".to_string()),
    }
    Err(Unavailable::because(reasons.join("; ")))
}

/// Splits /proc/self/cgroup into this process's v1 memory cgroup path and its v2 path, both
/// relative to their hierarchy's root (e.g. "/process_api/b54ec").
fn parse_proc_cgroup(text: &str) -> (Option<String>, Option<String>) {
    let mut v1 = None;
    let mut v2 = None;
    for line in text.lines() {
        // The path is last and may itself contain ':'.
        let mut fields = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            v2.get_or_insert_with(|| path.to_string());
        } else if controllers.split(',').any(|c| c == "memory") {
            v1.get_or_insert_with(|| path.to_string());
        }
    }
    (v1, v2)
}

/// Where a hierarchy is mounted, and which of its directories the mount shows.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Mount {
    /// The hierarchy directory at the mount point; not "/" for bind mounts of a subtree, as in
    /// containers without a cgroup namespace.
    root: String,
    point: PathBuf,
}

impl Mount {
    /// The directory of cgroup `path` (as written in /proc/self/cgroup) under this mount, or
    /// `None` if the mount does not show it.
    fn dir_of(&self, path: &str) -> Option<PathBuf> {
        let rel = if self.root == "/" {
            path
        } else if path == self.root {
            ""
        } else {
            path.strip_prefix(self.root.as_str())
                .filter(|rest| rest.starts_with('/'))?
        };
        let rel = rel.trim_start_matches('/');
        // Paths outside a cgroup namespace show up as "/../..".
        if rel.split('/').any(|c| c == "..") {
            return None;
        }
        Some(if rel.is_empty() {
            self.point.clone()
        } else {
            self.point.join(rel)
        })
    }
}

#[derive(Debug, Default, PartialEq, Eq)]
struct CgroupMounts {
    v1_memory: Option<Mount>,
    v2: Option<Mount>,
}

impl CgroupMounts {
    /// The usual mount points, for when mountinfo cannot be read.
    fn fallback() -> CgroupMounts {
        let mount = |point: &str| Mount {
            root: "/".to_string(),
            point: PathBuf::from(point),
        };
        let v1 = mount("/sys/fs/cgroup/memory");
        let v2 = [mount("/sys/fs/cgroup/unified"), mount("/sys/fs/cgroup")]
            .into_iter()
            .find(|m| m.point.join("cgroup.controllers").exists());
        CgroupMounts {
            v1_memory: Some(v1).filter(|m| m.point.join("memory.limit_in_bytes").exists()),
            v2,
        }
    }
}

/// Finds the first v1 memory and the first cgroup2 mount in /proc/self/mountinfo text.
fn parse_mountinfo(text: &str) -> CgroupMounts {
    let mut mounts = CgroupMounts::default();
    for line in text.lines() {
        // "id parent maj:min root point options [optional fields...] - fstype source super"
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let left: Vec<&str> = left.split(' ').collect();
        let right: Vec<&str> = right.split(' ').collect();
        let (Some(root), Some(point), Some(fstype)) = (left.get(3), left.get(4), right.first())
        else {
            continue;
        };
        let mount = || Mount {
            root: unescape(root),
            point: PathBuf::from(unescape(point)),
        };
        match *fstype {
            "cgroup2" if mounts.v2.is_none() => mounts.v2 = Some(mount()),
            "cgroup"
                if mounts.v1_memory.is_none()
                    && right
                        .get(2)
                        .is_some_and(|opts| opts.split(',').any(|o| o == "memory")) =>
            {
                mounts.v1_memory = Some(mount())
            }
            _ => {}
        }
    }
    mounts
}

/// Undoes mountinfo's octal escapes of space, tab, newline and backslash ("\040").
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).filter(|d| {
            bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)) && d[0] <= b'3'
        });
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The one headroom formula, for [`MemCgroup::headroom`] and
/// [`Headroom::bytes`](crate::pressure::Headroom::bytes): what the cgroup can still charge
/// before anything but cheap page cache must go, `ceiling - (usage - reclaimable)`, 0 when
/// over.
pub(crate) fn headroom(ceiling: u64, usage: u64, reclaimable: u64) -> u64 {
    ceiling.saturating_sub(usage.saturating_sub(reclaimable))
}

/// What a cgroup can still charge before the kernel reclaims anything (page cache included):
/// `ceiling - usage`, 0 when over. Beside [`headroom`], which counts clean page cache as room.
pub(crate) fn free(ceiling: u64, usage: u64) -> u64 {
    ceiling.saturating_sub(usage)
}

/// The page cache a cgroup's `memory.stat` (its text, or the start of it) shows the kernel can
/// drop before anything else: the page cache less shared memory (which needs swap to go) and
/// less dirty and writeback pages (which must be written first), as the machine's MemAvailable
/// counts the page cache; hierarchical (v1's `total_` lines; v2's are). Not the inactive file
/// list: it also holds lazily freed anonymous pages, and a page read twice moves to the active
/// list, so a program re-reading its files would count as pressed. 0 where a line is missing.
/// By hand over bytes: the headroom poll reads the file into a stack buffer and must not
/// allocate.
pub(crate) fn reclaimable_file(stat: &[u8], version: Version) -> u64 {
    let keys: [&[u8]; 4] = match version {
        Version::V1 => [
            b"total_cache",
            b"total_shmem",
            b"total_dirty",
            b"total_writeback",
        ],
        Version::V2 => [b"file", b"shmem", b"file_dirty", b"file_writeback"],
    };
    let value = |key: &[u8]| {
        stat.split(|&b| b == b'\n')
            .find_map(|line| {
                let rest = line.strip_prefix(key)?.strip_prefix(b" ")?;
                rest.iter().try_fold(0u64, |n, &d| {
                    d.is_ascii_digit()
                        .then(|| n.checked_mul(10)?.checked_add(u64::from(d - b'0')))
                        .flatten()
                })
            })
            .unwrap_or(0)
    };
    let [cache, shmem, dirty, writeback] = keys.map(value);
    cache
        .saturating_sub(shmem)
        .saturating_sub(dirty)
        .saturating_sub(writeback)
}

/// The number after `key` on the line starting with exactly that key ("oom_kill 3").
fn keyed_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next() == Some(key))
            .then(|| words.next()?.parse().ok())
            .flatten()
    })
}

fn read_u64(path: &Path) -> io::Result<u64> {
    let text = crate::fd::read_file(path)?;
    text.trim()
        .parse()
        .map_err(|_| invalid_data(format!("{}: not a number: {text:?}", path.display())))
}

/// A v2 limit file: a number of bytes, or "max" for none.
fn read_limit_v2(path: &Path) -> Option<u64> {
    read_u64(path).ok()
}

/// Writes `value` in one write(2), which cgroup files require; never creates the file.
fn write_file(path: &Path, value: &str) -> io::Result<()> {
    OpenOptions::new()
        .write(true)
        .open(path)?
        .write_all(value.as_bytes())
}

fn invalid_data(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_cgroup_v1_and_v2() {
        let text = "9:name=systemd:/\n\
                    4:memory:/process_api/b54ec\n\
                    1:cpu:/\n\
                    0::/\n";
        assert_eq!(
            parse_proc_cgroup(text),
            (Some("/process_api/b54ec".into()), Some("/".into()))
        );
    }

    #[test]
    fn proc_cgroup_v2_only() {
        assert_eq!(
            parse_proc_cgroup("0::/user.slice/session-1.scope\n"),
            (None, Some("/user.slice/session-1.scope".into()))
        );
    }

    #[test]
    fn proc_cgroup_comma_controllers_and_colon_in_path() {
        let text = "5:cpuacct,cpu:/a\n4:cpu,memory:/x:y\n";
        assert_eq!(parse_proc_cgroup(text), (Some("/x:y".into()), None));
        // "memory" must be a whole controller name.
        assert_eq!(parse_proc_cgroup("3:memoryx:/z\n"), (None, None));
    }

    #[test]
    fn mountinfo_finds_memory_and_cgroup2() {
        let text = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
            32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime shared:7 - cgroup cgroup rw,cpu\n\
            35 31 0:32 /docker/abc /my\\040cg rw,relatime shared:9 master:2 - cgroup cgroup rw,cpu,memory\n\
            40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd\n\
            41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate\n";
        let m = parse_mountinfo(text);
        assert_eq!(
            m.v1_memory,
            Some(Mount {
                root: "/docker/abc".into(),
                point: "/my cg".into()
            })
        );
        assert_eq!(
            m.v2,
            Some(Mount {
                root: "/".into(),
                point: "/sys/fs/cgroup/unified".into()
            })
        );
        let v1 = m.v1_memory.unwrap();
        assert_eq!(v1.dir_of("/docker/abc"), Some("/my cg".into()));
        assert_eq!(v1.dir_of("/docker/abc/t1"), Some("/my cg/t1".into()));
        assert_eq!(v1.dir_of("/docker/abcd"), None);
        assert_eq!(v1.dir_of("/other"), None);
    }

    #[test]
    fn mountinfo_without_cgroups() {
        let text = "22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\nnot a mountinfo line\n";
        assert_eq!(parse_mountinfo(text), CgroupMounts::default());
    }

    #[test]
    fn dir_of_rejects_paths_outside_namespace() {
        let m = Mount {
            root: "/".into(),
            point: "/sys/fs/cgroup/unified".into(),
        };
        assert_eq!(m.dir_of("/"), Some("/sys/fs/cgroup/unified".into()));
        assert_eq!(m.dir_of("/../x"), None);
    }

    #[test]
    fn oom_kill_line_is_matched_exactly() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(keyed_value(v1, "oom_kill"), Some(3));
        let v2 = "low 0\nhigh 0\nmax 0\noom 1\noom_kill 2\noom_group_kill 0\n";
        assert_eq!(keyed_value(v2, "oom_kill"), Some(2));
        assert_eq!(keyed_value("oom_kill_disable 0\n", "oom_kill"), None);
    }

    #[test]
    fn bad_child_names_are_rejected_before_touching_anything() {
        let cg = MemCgroup {
            version: Version::V1,
            path: "/nonexistent".into(),
        };
        for name in ["", ".", "..", "a/b", "/a", "a\0"] {
            let err = cg.create_child(name, 1 << 20).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{name:?}");
        }
    }

    #[test]
    fn unique_names_differ() {
        assert_ne!(unique_name("t-"), unique_name("t-"));
    }
}
