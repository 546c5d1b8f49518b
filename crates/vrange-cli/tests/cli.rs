//! The `vrange` command end to end: each subcommand runs and prints what it should, `run`
//! passes exit codes and signals through, `stat` reads a live process.

mod common;
use common::{lib, vrange};

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PYTHON: &str = "/usr/bin/python3";

#[test]
fn features_reports_the_kernel() {
    let out = vrange().arg("features").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for key in ["page size", "MADV_FREE", "THP"] {
        assert!(text.contains(key), "features lacks {key}:\n{text}");
    }
}

#[test]
fn run_passes_exit_codes_and_signals_through() {
    let out = vrange()
        .args(["run", "--lib"])
        .arg(lib())
        .args(["--", "sh", "-c", "exit 7"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(7));
    let out = vrange()
        .args(["run", "--lib"])
        .arg(lib())
        .args(["--", "sh", "-c", "kill -TERM $$"])
        .output()
        .unwrap();
    assert_eq!(out.status.signal(), Some(libc::SIGTERM), "{out:?}");
    let out = vrange()
        .args(["run", "--lib"])
        .arg(lib())
        .args(["--", "/nonexistent/program"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(127));
}

#[test]
fn run_with_stats_sums_up_the_program() {
    if !std::path::Path::new(PYTHON).exists() {
        vrange_testkit::skip(format_args!("{PYTHON} missing"));
        return;
    }
    let script = "b = [bytearray(1 << 20) for _ in range(40)]\nfor _ in range(200):\n    b.append(bytearray(1 << 19)); b.pop(0)\nprint('done')";
    let out = vrange()
        .args(["run", "--stats", "--lib"])
        .arg(lib())
        .args(["--", PYTHON, "-c", script])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "done");
    assert!(err.contains("peak RSS"), "{err}");
    let allocations: u64 = err
        .split("used vrange-malloc: ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no allocation count in:\n{err}"));
    assert!(
        allocations >= 240,
        "python's large buffers went through vrange-malloc: {err}"
    );
    assert!(err.contains("reused without a page fault"), "{err}");
}

#[test]
fn stat_reads_a_live_process() {
    if !std::path::Path::new(PYTHON).exists() {
        vrange_testkit::skip(format_args!("{PYTHON} missing"));
        return;
    }
    // A process that frees 64 MiB of large blocks and waits: its free memory is volatile.
    let mut child = Command::new(PYTHON)
        .args([
            "-c",
            "import sys, time\nb = [bytearray(1 << 20) for _ in range(64)]\ndel b\nprint('ready', flush=True)\nsys.stdin.read()",
        ])
        .env("LD_PRELOAD", lib())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), "ready");
    let pid = child.id();
    let volatile = |text: &str| -> f64 {
        text.split("volatile ")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    // The reclaimer publishes every 250 ms: wait for a snapshot taken after the frees.
    let deadline = Instant::now() + Duration::from_secs(5);
    let text = loop {
        let out = vrange().args(["stat", &pid.to_string()]).output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        if volatile(&text) >= 60.0 || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    drop(child.stdin.take());
    let _ = child.wait();
    assert!(
        text.contains("RSS") && text.contains("LazyFree") && text.contains("VmPTE"),
        "{text}"
    );
    assert!(
        text.contains("vrange-malloc: live"),
        "no published statistics:\n{text}"
    );
    let free = volatile(&text);
    assert!(
        free >= 60.0,
        "64 MiB freed should be volatile, saw {free} MiB:\n{text}"
    );
    assert!(
        !std::path::Path::new(&format!("/dev/shm/vrange-{pid}.stats")).exists(),
        "the statistics file is removed at exit"
    );
    let gone = vrange().args(["stat", &pid.to_string()]).output().unwrap();
    assert!(!gone.status.success(), "a dead process is an error");
}

#[test]
fn demo_runs_and_checks_itself() {
    let out = vrange().arg("demo").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("detection:") && text.contains("exact"),
        "{text}"
    );
    assert!(text.contains("vrange-malloc:"), "{text}");
}

#[test]
fn bench_rejects_unknown_suites() {
    let out = vrange().args(["bench", "nonsense"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
}

/// A file left by a killed process whose pid now names another process is not believed (the
/// start time differs), and is removed.
#[test]
fn stat_ignores_a_stale_statistics_file() {
    let mut sleeper = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = sleeper.id();
    let path = format!("/dev/shm/vrange-{pid}.stats");
    std::fs::write(
        &path,
        format!("pid={pid}\nstart_ticks=1\nvolatile_bytes=123456789\n"),
    )
    .unwrap();
    let out = vrange().args(["stat", &pid.to_string()]).output().unwrap();
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("no statistics published"), "{text}");
    assert!(
        !std::path::Path::new(&path).exists(),
        "the stale file is removed"
    );
}
