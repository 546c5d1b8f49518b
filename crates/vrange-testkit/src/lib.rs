//! Test tooling shared by every crate of the workspace (a dev-dependency only; never shipped).
//!
//! # Skips
//! One policy for every test that needs something this machine may lack (a memory cgroup,
//! mlock, a program): [`skip`] prints `skipped: <reason>` and the test returns, except under
//! CI (`CI` set to anything but empty, `0` or `false`), where every test must run and a skip
//! fails the test. Each skip is also appended to the file named by `VRANGE_SKIP_LOG`, if set,
//! so that `.ci/run` can list them at the end.

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
            let _ = writeln!(f, "{test}: {reason}");
        }
    }
    assert!(
        !ci(),
        "{test}: {reason} (CI is set, so this test must run: fix the environment)"
    );
    println!("skipped: {reason}");
}
