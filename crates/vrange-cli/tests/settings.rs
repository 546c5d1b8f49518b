//! The `vrange` command's size flags use vrange's one size grammar: a malformed value is refused
//! by the argument parser with a message and exit status 2, a well-formed one in any spelling is
//! taken; and a malformed `VRANGE_*` variable in the environment of `vrange run` is reported
//! once, in one line, by the program it runs, which works on.

// ci: host only: the size grammar

mod common;
use common::{lib, vrange};

use vrange_testkit::proc::show;

/// Checks that `args` are refused with exit status 2 and a message naming `flag` and `value`.
fn refused(args: &[&str], flag: &str, value: &str) {
    let out = vrange().args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "vrange {args:?}: {}",
        show(&out)
    );
    assert!(
        stderr.contains(flag) && stderr.contains(value),
        "vrange {args:?} does not say what is wrong: {}",
        show(&out)
    );
}

#[test]
fn run_refuses_a_malformed_budget_with_status_2() {
    for bad in ["12Q", "1.5G", "-1", "M", ""] {
        refused(&["run", "--budget", bad, "true"], "--budget", bad);
    }
}

#[test]
fn run_passes_a_budget_in_any_spelling_as_bytes() {
    for (budget, bytes) in [("64MiB", "67108864"), ("64m", "67108864"), ("1 KB", "1024")] {
        let out = vrange()
            .args(["run", "--budget", budget, "--lib"])
            .arg(lib())
            .args(["--", "sh", "-c", "echo \"$VRANGE_MALLOC_BUDGET\""])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", show(&out));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), bytes);
        assert_eq!(String::from_utf8_lossy(&out.stderr), "", "{}", show(&out));
    }
}

#[test]
fn run_reports_a_malformed_variable_once_and_the_program_works() {
    let out = vrange()
        .args(["run", "--lib"])
        .arg(lib())
        // One process: a shell would be a second one, which reports it again.
        .args(["--", "echo", "works"])
        .env("VRANGE_POLL_MS", "fast")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", show(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "works\n");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "vrange: VRANGE_POLL_MS=fast is not valid (milliseconds); using 100\n",
        "{}",
        show(&out)
    );
}
