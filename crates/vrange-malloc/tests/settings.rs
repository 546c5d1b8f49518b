//! Settings under the LD_PRELOAD shim: each malformed variable is reported once per process, in
//! one line naming it, what it accepts and the value used instead (written from inside the
//! first malloc, without allocating), and the program runs exactly as without the shim; sizes
//! and keywords in any spelling of the one grammar are taken silently; a program started with
//! standard error closed is not disturbed by the warnings it cannot get.
//!
//! The program is `tests/c/big_blocks.c` (large blocks through every entry point, threads and
//! fork children, a checksum on stdout), compiled with gcc.

// ci: host only: the settings grammar and its one-line warnings, the same on every kernel

// Plays the program vrange is a guest in: closes, duplicates and inspects descriptors by
// number, which vrange's own code may only do through vrange_sys (clippy.toml).
#![allow(clippy::disallowed_methods)]

mod common;
use common::*;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::sync::OnceLock;
use vrange_testkit::proc::{output, show};
use vrange_testkit::scratch::Scratch;
use vrange_testkit::{missing, skip};

const GCC: &str = "/usr/bin/gcc";

/// big_blocks, compiled once, and its output without the shim; `None` (skipped) without gcc.
fn big_blocks() -> Option<&'static (PathBuf, String)> {
    static BUILT: OnceLock<Option<(PathBuf, String)>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            if let Some(reason) = missing(&[GCC]) {
                skip(reason);
                return None;
            }
            // Kept for the life of the test process: the scratch directory is never dropped.
            let dir = Box::leak(Box::new(Scratch::new("settings")));
            let exe = dir.join("big_blocks");
            compile("big_blocks.c", &exe, &["-pthread"]);
            let plain = output(without_shim(&mut Command::new(&exe)));
            assert!(
                plain.status.success(),
                "big_blocks without the shim\n{}",
                show(&plain)
            );
            Some((exe, String::from_utf8_lossy(&plain.stdout).into_owned()))
        })
        .as_ref()
}

/// Runs big_blocks under the shim with `env` added (and `cmd_hook` applied), and checks it
/// printed what it prints without the shim; `None` when the test is skipped.
fn run(env: &[(&str, &str)], cmd_hook: fn(&mut Command)) -> Option<Output> {
    let (exe, expected) = big_blocks()?;
    let mut cmd = Command::new(exe);
    with_shim(&mut cmd, &[]).envs(env.iter().copied());
    cmd_hook(&mut cmd);
    let out = output(&mut cmd);
    assert!(out.status.success(), "{cmd:?} failed\n{}", show(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        expected.as_str(),
        "{cmd:?} printed something else than without the shim\n{}",
        show(&out)
    );
    Some(out)
}

#[test]
fn malformed_variables_are_reported_once_and_the_defaults_used() {
    let Some(out) = run(
        &[
            ("VRANGE_MALLOC_THRESHOLD", "64MB!"),
            ("VRANGE_MALLOC_MODE", "bogus"),
            ("VRANGE_MALLOC_THP", "sometimes"),
            ("VRANGE_MALLOC_ARM_DELAY_MS", "soon"),
            ("VRANGE_MALLOC_BUDGET", "12Q"),
            ("VRANGE_POLL_MS", "fast"),
        ],
        |_| {},
    ) else {
        return;
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    let size = vrange_sys::settings::SIZE_GRAMMAR;
    // In the order they are read; once each although big_blocks forks and starts threads.
    let expected = [
        "vrange: VRANGE_MALLOC_THRESHOLD=64MB! is not valid (a size of at least 16K, such as 64K \
         or 1MiB); using 64K"
            .to_string(),
        "vrange: VRANGE_MALLOC_MODE=bogus is not valid (hybrid, managed, lazy, off); using hybrid"
            .into(),
        "vrange: VRANGE_MALLOC_THP=sometimes is not valid (auto, always, never); using auto".into(),
        "vrange: VRANGE_POLL_MS=fast is not valid (milliseconds); using 100".into(),
        "vrange: VRANGE_MALLOC_ARM_DELAY_MS=soon is not valid (milliseconds); using 1000".into(),
        format!("vrange: VRANGE_MALLOC_BUDGET=12Q is not valid ({size}); using 0"),
    ];
    assert_eq!(vrange_complaints(&stderr), expected, "\n{}", show(&out));
    let served: u64 = summaries(&stderr).iter().map(|s| s.allocations).sum();
    assert!(
        served > 0,
        "the defaults apply: blocks are served\n{}",
        show(&out)
    );
}

#[test]
fn a_threshold_below_the_minimum_is_raised_and_said_so() {
    let Some(out) = run(&[("VRANGE_MALLOC_THRESHOLD", "4K")], |_| {}) else {
        return;
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        vrange_complaints(&stderr),
        [
            "vrange: VRANGE_MALLOC_THRESHOLD=4K is not valid (a size of at least 16K, such as 64K \
          or 1MiB); using 16K"
        ],
        "\n{}",
        show(&out)
    );
}

#[test]
fn sizes_and_keywords_in_any_spelling_are_taken_silently() {
    // 1 TiB: nothing big_blocks asks for is served (the KiB spellings used to be refused).
    let Some(out) = run(
        &[
            ("VRANGE_MALLOC_THRESHOLD", "1TiB"),
            ("VRANGE_MALLOC_MODE", " Managed "),
            ("VRANGE_MALLOC_THP", "NEVER"),
            ("VRANGE_MALLOC_BUDGET", "64 mib"),
            ("VRANGE_MALLOC_STATS", "yes"),
        ],
        |_| {},
    ) else {
        return;
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(vrange_complaints(&stderr).is_empty(), "\n{}", show(&out));
    let sums = summaries(&stderr);
    assert!(
        !sums.is_empty(),
        "VRANGE_MALLOC_STATS=yes prints the summary\n{}",
        show(&out)
    );
    assert!(
        sums.iter().all(|s| s.allocations == 0),
        "nothing is served below a 1 TiB threshold\n{}",
        show(&out)
    );
}

#[test]
fn warnings_to_a_closed_stderr_do_not_disturb_the_program() {
    run(
        &[
            ("VRANGE_MALLOC_MODE", "bogus"),
            ("VRANGE_POLL_MS", "fast"),
            ("VRANGE_MALLOC_STATS", "off"),
        ],
        |cmd| {
            // SAFETY: close(2) is async-signal-safe; the child starts with descriptor 2 closed.
            unsafe {
                cmd.pre_exec(|| {
                    libc::close(2);
                    Ok(())
                })
            };
        },
    );
}
