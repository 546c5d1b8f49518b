//! Child memory cgroups for tests and benchmarks: where one gets one, and why it cannot here.
//!
//! Reading and managing cgroups is `vrange_sys::cgroup`'s (the library uses it too); this
//! module holds the fixtures around it: unique names, the one judgement of which failures
//! mean "this environment does not allow it" (a skip reason) rather than a bug (a panic), and
//! the counters tests and benchmarks report.

use std::process::Command;

use std::io;
use vrange_sys::cgroup::{unique_name, ChildCgroup, MemCgroup, Version};

/// Whether creating a child cgroup failed because this environment does not allow it
/// (no permission, a read-only or controller-less hierarchy), not because something is wrong.
pub fn not_allowed(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::PermissionDenied | io::ErrorKind::Unsupported
    ) || [libc::EROFS, libc::EOPNOTSUPP, libc::ENOTSUP, libc::ENOSYS]
        .contains(&e.raw_os_error().unwrap_or(0))
}

/// This process's memory cgroup, or why there is none (a skip reason).
pub fn current() -> Result<MemCgroup, String> {
    MemCgroup::current().ok_or_else(|| "this process has no readable memory cgroup".to_string())
}

/// This process's memory cgroup if it is cgroup v1, or why not (a skip reason). `why` says
/// what the test needs v1 for ("vmpressure events", ...).
pub fn current_v1(why: &str) -> Result<MemCgroup, String> {
    let cg = current()?;
    if cg.version() != Version::V1 {
        return Err(format!(
            "the memory cgroup {} is v2; this test needs cgroup v1 ({why})",
            cg.path().display()
        ));
    }
    Ok(cg)
}

/// Whether this machine has no cgroup v1 memory controller for this process (its memory cgroup,
/// as the library finds it, is v2): the answer [`crate::skip_lacking`] wants for tests of
/// v1-only mechanisms (vmpressure).
pub fn v1_lacking() -> bool {
    MemCgroup::current().is_some_and(|c| c.version() == Version::V2)
}

/// A fresh child of `parent`, named after `prefix` and unique in this process, with a hard
/// limit of `limit` bytes and no swap; removed when dropped. `Err` (a skip reason) where this
/// environment does not allow it ([`not_allowed`]); panics on any other failure.
pub fn child_of(parent: &MemCgroup, prefix: &str, limit: u64) -> Result<ChildCgroup, String> {
    match parent.create_child(&unique_name(prefix), limit) {
        Ok(child) => Ok(child),
        Err(e) if not_allowed(&e) => Err(cannot_create(parent, &e)),
        Err(e) => panic!("create a child of {}: {e}", parent.path().display()),
    }
}

fn cannot_create(parent: &MemCgroup, e: &io::Error) -> String {
    format!(
        "cannot create a memory cgroup under {}: {e}",
        parent.path().display()
    )
}

/// Where tests make their child cgroups: the directory `VRANGE_TEST_CGROUP` names, if set, else
/// this process's memory cgroup. On cgroup v2 a cgroup cannot both hold processes and enable
/// the memory controller for its children, so a v2 runner (`.ci/guest-tests`) lives in one
/// leaf and names a sibling with memory enabled here.
pub fn parent() -> Result<MemCgroup, String> {
    match std::env::var_os("VRANGE_TEST_CGROUP") {
        Some(dir) => MemCgroup::at(std::path::Path::new(&dir)).ok_or_else(|| {
            format!(
                "VRANGE_TEST_CGROUP={} is not a memory cgroup",
                std::path::Path::new(&dir).display()
            )
        }),
        None => current(),
    }
}

/// A fresh child for a test: [`parent`], then [`child_of`].
pub fn child(prefix: &str, limit: u64) -> Result<ChildCgroup, String> {
    child_of(&parent()?, prefix, limit)
}

/// A fresh child of [`parent`] for a benchmark, or why there cannot be one: unlike [`child`],
/// every failure is a reason (a suite reports it and goes on; a v2 cgroup holding processes,
/// say, cannot give its children a memory controller), and without root that is said first.
pub fn try_child(prefix: &str, limit: u64) -> Result<ChildCgroup, String> {
    if !crate::is_root() {
        return Err("not root: creating a memory cgroup needs root".into());
    }
    let parent = parent()?;
    parent
        .create_child(&unique_name(prefix), limit)
        .map_err(|e| cannot_create(&parent, &e))
}

/// Makes the child of `cmd` join `cg` before it execs, so that everything it faults in is
/// charged there.
///
/// # Errors
/// `cg`'s `cgroup.procs` cannot be opened.
pub fn join(cmd: &mut Command, cg: &MemCgroup) -> Result<(), String> {
    let procs = cg.file("cgroup.procs");
    vrange_sys::cgroup::join_before_exec(cmd, &procs)
        .map_err(|e| format!("open {}: {e}", procs.display()))
}

/// A fresh child for a test of cgroup v2's `memory.high`: throttled above `high` bytes, with a
/// hard limit of `limit` far above it. `None` after skipping the test where no child can be
/// made, or where the test cgroups are v1, which has no `memory.high` (a skip listed as the
/// kernel lacking it when the feature probe, [`v2_lacking`], finds the memory controller on
/// v1). The caller returns on `None`.
#[track_caller]
pub fn child_high(prefix: &str, high: u64, limit: u64) -> Option<ChildCgroup> {
    let made = parent().and_then(|parent| {
        if parent.version() != Version::V2 {
            return Err(format!(
                "the memory cgroup {} is v1, which has no memory.high",
                parent.path().display()
            ));
        }
        let child = child_of(&parent, prefix, limit)?;
        std::fs::write(child.cgroup().file("memory.high"), high.to_string())
            .map_err(|e| format!("cannot set memory.high: {e}"))?;
        Ok(child)
    });
    match made {
        Ok(child) => Some(child),
        Err(why) => {
            crate::skip_lacking("a cgroup v2 memory controller", v2_lacking(), why);
            None
        }
    }
}

/// Whether this process's memory controller, as the library finds it, is cgroup v1: the
/// answer [`crate::skip_lacking`] wants for tests of v2-only limits (`memory.high`).
pub fn v2_lacking() -> bool {
    MemCgroup::current().is_some_and(|c| c.version() == Version::V1)
}

/// Removes a test's child cgroup (moving any process still in it to the parent first) and
/// asserts that its directory is gone: a test must never leave one behind. Reap the processes
/// that ran in it first.
#[track_caller]
pub fn remove(child: ChildCgroup) {
    let dir = child.cgroup().path().to_path_buf();
    drop(child);
    assert!(
        !dir.exists(),
        "{} left behind: removing its ChildCgroup did not remove it",
        dir.display()
    );
}

/// Times the cgroup's usage hit its limit: v1's `memory.failcnt`, v2's `max` event count in
/// `memory.events`.
pub fn limit_hits(cg: &MemCgroup) -> Option<u64> {
    match cg.version() {
        Version::V1 => std::fs::read_to_string(cg.file("memory.failcnt"))
            .ok()?
            .trim()
            .parse()
            .ok(),
        Version::V2 => v2_event(cg, "max"),
    }
}

/// The count of event `name` (`max`, `high`, `oom_kill`, ...) in a v2 cgroup's `memory.events`.
pub fn v2_event(cg: &MemCgroup, name: &str) -> Option<u64> {
    std::fs::read_to_string(cg.file("memory.events"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))?
        .trim()
        .parse()
        .ok()
}

/// The cgroup's peak usage in bytes, where the hierarchy records it.
pub fn peak(cg: &MemCgroup) -> Option<u64> {
    let name = match cg.version() {
        Version::V1 => "memory.max_usage_in_bytes",
        Version::V2 => "memory.peak",
    };
    std::fs::read_to_string(cg.file(name))
        .ok()?
        .trim()
        .parse()
        .ok()
}
