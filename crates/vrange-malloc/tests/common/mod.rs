//! What the allocator's tests that run other programs under the LD_PRELOAD shim share
//! (`programs.rs`, `guest.rs`, `settings.rs`, `pressure.rs`): compiling the C helpers in
//! `tests/c/`, running a command with or without the shim, and reading the summary the shim
//! prints at exit. Building the shim, scratch directories and skips are `vrange-testkit`'s.
#![allow(dead_code)] // each test file uses its own subset

use std::path::{Path, PathBuf};
use std::process::Command;
use vrange_testkit::build::shim;
use vrange_testkit::proc::{output, show, without_vrange_env};

/// A C source: a name is a file of `tests/c/`, an absolute path stays as it is.
pub fn c_source(source: impl AsRef<Path>) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(source)
}

/// Keeps the shim and its settings out of a command (the test itself may run under them).
pub fn without_shim(cmd: &mut Command) -> &mut Command {
    without_vrange_env(cmd.env_remove("LD_PRELOAD"))
}

/// Runs a command under the shim (after any `extra` preloads) with the exit summary on.
pub fn with_shim<'a>(cmd: &'a mut Command, extra: &[&Path]) -> &'a mut Command {
    let mut preload = shim().as_os_str().to_owned();
    for p in extra {
        preload.push(" ");
        preload.push(p.as_os_str());
    }
    without_shim(cmd)
        .env("LD_PRELOAD", preload)
        .env("VRANGE_MALLOC_STATS", "1")
}

/// [`with_shim`] or [`without_shim`], as `shim` says: for tests that run a program both ways.
pub fn shim_if(cmd: &mut Command, shim: bool) -> &mut Command {
    if shim {
        with_shim(cmd, &[])
    } else {
        without_shim(cmd)
    }
}

/// Compiles `source` (a file of `tests/c/`, or an absolute path) with `/usr/bin/gcc -O2 -Wall -Wextra -Werror` and
/// `flags` into `out`, without the shim.
pub fn compile(source: impl AsRef<Path>, out: &Path, flags: &[&str]) {
    let mut cmd = Command::new("/usr/bin/gcc");
    cmd.args(["-O2", "-Wall", "-Wextra", "-Werror"])
        .args(flags)
        .arg("-o")
        .arg(out)
        .arg(c_source(source));
    let o = output(without_shim(&mut cmd));
    assert!(o.status.success(), "{cmd:?} failed\n{}", show(&o));
}

/// The first line of the shim's exit summary (`VRANGE_MALLOC_STATS=1`), one per process:
/// "vrange-malloc: N allocations, M frees; ..." and, on its second line, "purged in all X MiB
/// by the reclaimer".
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    /// Blocks the shim served (requests at or above its threshold).
    pub allocations: u64,
    pub frees: u64,
    /// MiB the reclaimer purged over the process's life.
    pub purged_mib: f64,
}

/// Every summary in a stderr text, in order (a program that runs others prints several).
pub fn summaries(stderr: &str) -> Vec<Summary> {
    let mut out: Vec<Summary> = Vec::new();
    for line in stderr.lines() {
        let Some(rest) = line.strip_prefix("vrange-malloc: ") else {
            continue;
        };
        if let Some((n, rest)) = rest.split_once(" allocations, ") {
            let frees = rest.split_once(" frees").map(|(f, _)| f);
            if let (Ok(allocations), Some(Ok(frees))) = (n.parse(), frees.map(str::parse)) {
                out.push(Summary {
                    allocations,
                    frees,
                    purged_mib: f64::NAN,
                });
            }
        } else if let Some((_, tail)) = rest.split_once("purged in all ") {
            let mib = tail.strip_suffix(" MiB by the reclaimer").map(str::parse);
            if let (Some(last), Some(Ok(mib))) = (out.last_mut(), mib) {
                last.purged_mib = mib;
            }
        }
    }
    out
}

/// Lines of a stderr text that mention vrange but are not the exit summary (warnings, panics).
pub fn vrange_complaints(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.contains("vrange") && !l.starts_with("vrange-malloc: "))
        .collect()
}
