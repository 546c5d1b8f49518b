//! Test tooling shared by every crate of the workspace, and by the benchmark suites (a
//! dev-dependency of the published crates and a dependency of vrange-bench, unpublished too;
//! never shipped).
//!
//! What lives here is what more than one test file, crate or benchmark needs; what only one
//! crate's tests need stays in that crate's `tests/common`. It builds on `vrange-sys` (the OS
//! layer) and never on the core, so the core's own tests can use it.
//!
//! - [`skip`] (below), [`missing`], [`is_root`], [`serial`]: whether and when a test runs;
//! - [`pattern`]: deterministic page contents, to tell kept, lost and corrupted pages apart;
//! - [`fork`]: forked children of the multi-threaded harness, and a pipe pair to talk to them;
//! - [`proc`]: spawned processes ([`proc::Proc`]) and how they ended ([`proc::Exit`]);
//! - [`role`]: the test binary re-executed to play a role, talking in lines;
//! - [`cgroup`]: child memory cgroups for tests (the cgroup access itself is `vrange_sys`'s);
//! - [`hog`]: a process that takes memory, and makes itself the OOM killer's choice;
//! - [`thrash`]: a memory cgroup thrashing at its limit (what the pressure sources answer);
//! - [`procfs`]: kernel counters as tests want them (thin calls into `vrange_sys::procfs`);
//! - [`build`]: the workspace's artifacts cargo does not build for a test (the shim, the C
//!   library), and the C workloads of the vrange-bench suites;
//! - [`sched`]: starving a thread of this process (the reclaimer falling behind);
//! - [`scratch`]: scratch directories;
//! - [`signal`]: SIGBUS handlers for tests of SIGBUS mode and refill regions;
//! - [`mod@bench`]: the criterion benchmarks' labels and results;
//! - [`layers`]: which module of a crate names which, which crate depends on which (read
//!   from the sources; the rules are `tests/layers.rs`'s).
//!
//! # Skips
//! One policy for every test that needs something this machine may lack (a memory cgroup,
//! mlock, a program): [`skip`] prints `skipped: <reason>` and the test returns, except under
//! CI (`CI` set to anything but empty, `0` or `false`), where every test must run and a skip
//! fails the test. Each skip is also appended to the file named by `VRANGE_SKIP_LOG`, if set,
//! so that `.ci/run` can list them at the end. The one exception is [`skip_lacking`]: a test of
//! a kernel feature that vrange's own probe (`vrange::features()`) finds missing is
//! skipped under CI too, and listed as such (`kernel lacks ...`): CI runs older kernels (Linux
//! 6.1 in a guest, `.ci/guest-tests`), and a feature the probe says is there must be tested.

pub mod bench;
pub mod build;
pub mod cgroup;
pub mod confine;
pub mod fork;
pub mod hog;
pub mod layers;
pub mod lru;
pub mod pattern;
pub mod proc;
pub mod procfs;
pub mod role;
pub mod sched;
pub mod scratch;
pub mod signal;
pub mod thrash;

use std::fmt::Display;
use std::io::Write;

/// Whether the tests run in CI: a test that cannot run here fails there instead of skipping.
pub fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "0" | "false"))
}

/// Says why a test does not run: prints `skipped: <reason>` and logs it; under CI, panics.
/// The caller returns after it.
#[track_caller]
pub fn skip(reason: impl Display) {
    let test = log_skip(&reason);
    assert!(
        !ci(),
        "{test}: {reason} (CI is set, so this test must run: fix the environment)"
    );
    println!("skipped: {reason}");
}

/// Skips a test of `feature` because the kernel lacks it, which `lacking` (the answer of
/// `vrange::features()`, the probe the library itself trusts) must confirm: then the
/// test is skipped and listed even under CI. If the probe says the kernel has the feature, this
/// is an ordinary [`skip`] (a failure under CI): the test must not excuse itself from a kernel
/// the library would use the feature on. The caller returns after it.
#[track_caller]
pub fn skip_lacking(feature: &str, lacking: bool, reason: impl Display) {
    if !lacking {
        return skip(format!(
            "{reason} (yet the feature probe finds {feature} on this kernel)"
        ));
    }
    log_skip(&format_args!("kernel lacks {feature}: {reason}"));
    println!("skipped: kernel lacks {feature}: {reason}");
}

/// Appends `<test>: <reason>` to the skip log; returns the test's name.
fn log_skip(reason: &dyn Display) -> String {
    let test = std::thread::current()
        .name()
        .unwrap_or("(unnamed)")
        .to_string();
    if let Some(log) = std::env::var_os("VRANGE_SKIP_LOG") {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
        {
            // One write of the whole line: with O_APPEND, lines of tests running at once stay
            // whole (a `writeln!` writes piece by piece).
            let _ = f.write_all(format!("{test}: {reason}\n").as_bytes());
        }
    }
    test
}

/// The programs in `paths` that do not exist, as a skip reason (`None`: all present).
pub fn missing(paths: &[&str]) -> Option<String> {
    let gone: Vec<&str> = paths
        .iter()
        .copied()
        .filter(|p| !std::path::Path::new(p).exists())
        .collect();
    (!gone.is_empty()).then(|| format!("{} not installed", gone.join(", ")))
}

/// Whether the tests run as root (memory cgroups, other users' processes).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Serialises the tests of one test binary that must not overlap: pressure scenarios (their
/// timings are the point, and two would share the machine's cores), suites that measure, and
/// tests that fork (a fork copies every mapping of the process, so a concurrent test's pages
/// would be shared, and MADV_FREE/MADV_PAGEOUT skip shared pages; its pipe descriptors would be
/// held open by the wrong child). One lock per test process.
pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
