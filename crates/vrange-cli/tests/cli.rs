//! The `vrange` command end to end: each subcommand runs and prints what it should, `run`
//! passes exit codes and signals through, `stat` reads a live process.

// ci: guest 6.12 only: the command's cgroup v2 answers (the host and 6.1 have v1); its other output is the same on every kernel

mod common;
use common::{lib, vrange};

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PYTHON: &str = "/usr/bin/python3";

use vrange_testkit::proc::without_vrange_env;
use vrange_testkit::{is_root, skip};

/// The uid the unprivileged runs use (nobody).
use vrange_testkit::confine::{Confinement, NOBODY};
use vrange_testkit::scratch::Scratch;

/// A copy of the vrange executable that any user can run (the build directory may be private
/// to its owner), in a directory removed when the guard drops.
fn public_vrange() -> (tempfile::TempDir, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix("vrange-cli-test-")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let exe = dir.path().join("vrange");
    std::fs::copy(env!("CARGO_BIN_EXE_vrange"), &exe).unwrap();
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    (dir, exe)
}

/// `exe ARGS` run as uid and gid [`NOBODY`] with no supplementary groups.
fn as_nobody(exe: &std::path::Path, args: &[&str]) -> std::process::Output {
    let scratch = Scratch::new("cli-nobody");
    let mut c = Command::new(exe);
    c.args(args);
    without_vrange_env(&mut c);
    Confinement::Unprivileged.apply(&mut c, &scratch);
    vrange_testkit::confine::output_of_copy(&mut c).expect("run as nobody")
}

/// Under Docker's default seccomp profile and capabilities (`vrange_testkit::confine`),
/// `vrange features` says in one line each what is refused and what follows from it.
#[test]
fn features_say_what_dockers_default_profile_refuses() {
    if !is_root() {
        return skip("needs root to confine a child as Docker does");
    }
    let scratch = Scratch::new("cli-docker");
    let mut c = vrange();
    c.arg("features");
    let out = Confinement::Docker
        .apply(&mut c, &scratch)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    let row = |name| feature(&text, name).unwrap_or_else(|| panic!("no {name} row:\n{text}"));
    assert!(
        row("userfaultfd").starts_with("no (refused") && row("userfaultfd").contains("ENOTSUP"),
        "{text}"
    );
    assert_eq!(row("/dev/userfaultfd"), "no (not present)", "{text}");
    assert!(row("process_madvise").starts_with("no;"), "{text}");
    assert!(row("own descriptor table").starts_with("yes"), "{text}");
    assert!(row("create memory cgroups").starts_with("no"), "{text}");
    assert!(row("PSI triggers").contains("windows of 2, 4"), "{text}");
}

/// The value of row `name` of a `vrange features` report ("name:   value").
fn feature<'a>(report: &'a str, name: &str) -> Option<&'a str> {
    report
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

#[test]
fn features_reports_the_kernel_in_words() {
    let out = vrange().arg("features").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for key in [
        "page size",
        "MADV_FREE",
        "MADV_PAGEOUT",
        "THP",
        "userfaultfd",
        "/dev/userfaultfd",
        "MAP_DROPPABLE",
        "PSI triggers",
        "memory cgroup",
        "create memory cgroups",
    ] {
        assert!(
            feature(&text, key).is_some(),
            "features lacks {key}:\n{text}"
        );
    }
    // Plain words, not Rust values.
    for debug in [
        "Some(", "None", "true", "false", "Madvise", "Always", "V1", "V2", "[", "\"",
    ] {
        assert!(!text.contains(debug), "features prints {debug}:\n{text}");
    }
    let first_value_column = |l: &str| {
        l.find(':')
            .map(|c| c + 1 + l[c + 1..].find(|ch: char| ch != ' ').unwrap_or(0))
    };
    let columns: std::collections::BTreeSet<_> =
        text.lines().filter_map(first_value_column).collect();
    assert_eq!(columns.len(), 1, "the values are aligned:\n{text}");
}

/// `vrange features` answers for the credentials it runs with: root may create a memory
/// cgroup here, nobody may not, and says why.
#[test]
fn features_say_what_these_privileges_allow() {
    if !is_root() {
        return skip("needs root to compare with an unprivileged user");
    }
    let root = vrange().arg("features").output().unwrap();
    let root = String::from_utf8_lossy(&root.stdout).to_string();
    // Root in a cgroup v2 leaf with member processes (a runner's own cgroup) may not enable
    // memory for children there either, and is told so; nobody is refused before that rule.
    let allowed = feature(&root, "create memory cgroups");
    if allowed != Some("yes") && !allowed.is_some_and(|a| a.contains("has member processes")) {
        return skip(format!(
            "root cannot create a memory cgroup here: {:?}",
            feature(&root, "create memory cgroups")
        ));
    }
    let (_dir, exe) = public_vrange();
    let out = as_nobody(&exe, &["features"]);
    let nobody = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        feature(&nobody, "create memory cgroups"),
        Some(format!("no (not permitted for uid {NOBODY})").as_str()),
        "{nobody}"
    );
    assert_eq!(feature(&nobody, "MADV_FREE"), feature(&root, "MADV_FREE"));
}

/// `vrange stat` on a process it may not read says why, claims nothing about the process's use
/// of vrange, and exits with 3 (1 is "no such process").
#[test]
fn stat_says_why_it_cannot_read_a_process() {
    if !is_root() {
        return skip("needs root to start a process another user may not read");
    }
    // Killed below: long enough to outlive the commands of a slow emulated guest (with 30 s,
    // it had exited by the time it was read).
    let mut sleeper = Command::new("sleep").arg("3600").spawn().unwrap();
    let pid = sleeper.id().to_string();
    let (_dir, exe) = public_vrange();
    let out = as_nobody(&exe, &["stat", &pid]);
    let gone = as_nobody(&exe, &["stat", "4000000000"]);
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(3), "{stdout}{stderr}");
    assert!(
        stderr.contains(&format!(
            "cannot read /proc/{pid}/smaps_rollup: permission denied: the kernel's ptrace \
             access check (read mode) refused: pid {pid} runs as uid 0"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains("this process as uid 65534 gid 65534 without CAP_SYS_PTRACE"),
        "{stderr}"
    );
    assert!(stdout.contains("RSS") && !stdout.contains('?'), "{stdout}");
    assert!(
        !stdout.contains("does not use") && !stdout.contains("runs no vrange"),
        "claims what it cannot know:\n{stdout}"
    );
    assert_eq!(gone.status.code(), Some(1), "{gone:?}");
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
        .split("vrange-malloc served ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no allocation count in:\n{err}"));
    assert!(
        allocations >= 240,
        "python's large buffers went through vrange-malloc: {err}"
    );
    assert!(err.contains("was reused intact"), "{err}");
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
        !own_stats_dir().join(format!("vrange-{pid}.stats")).exists(),
        "the statistics file is removed at exit"
    );
    let gone = vrange().args(["stat", &pid.to_string()]).output().unwrap();
    assert!(!gone.status.success(), "a dead process is an error");
}

/// The demo under real pressure wherever the tests may create memory cgroups: in its own
/// cgroup, or (cgroup v2, where the tests' own cgroup holds processes) under the one the tests
/// make theirs in, given with `--cgroup`. Elsewhere it forces reclaim and says so.
#[test]
fn demo_runs_and_checks_itself() {
    let parent = vrange_testkit::cgroup::parent();
    let mut cmd = vrange();
    cmd.arg("demo");
    if let Some(dir) = std::env::var_os("VRANGE_TEST_CGROUP") {
        cmd.arg("--cgroup").arg(dir);
    }
    let out = cmd.output().unwrap();
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
    match parent.and_then(|p| p.may_create_child().map(|()| p).map_err(|e| e.to_string())) {
        Ok(p) => {
            assert!(
                text.contains("this process runs in a memory cgroup limited to"),
                "real pressure under {}: {text}",
                p.path().display()
            );
            let left: Vec<_> = std::fs::read_dir(p.path())
                .unwrap()
                .filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with("vrange-demo"))
                .map(|e| e.path())
                .collect();
            assert!(left.is_empty(), "the demo's cgroup is removed: {left:?}");
        }
        Err(why) => {
            assert!(text.contains("forcing reclaim with MADV_PAGEOUT"), "{text}");
            skip(format!("the demo could not make a memory cgroup: {why}"));
        }
    }
}

#[test]
fn demo_refuses_a_cgroup_that_is_not_one() {
    let out = vrange()
        .args(["demo", "--cgroup", "/nonexistent/vrange-cgroup"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "vrange demo: /nonexistent/vrange-cgroup is not a memory cgroup\n"
    );
    assert!(out.stdout.is_empty());
}

/// The benchmarks are their own command (vrange-bench, not installed): the installed one has
/// neither a `bench` subcommand nor the hidden `bench-role` its processes were started with.
#[test]
fn the_command_has_no_benchmark_subcommands() {
    for args in [&["bench", "all"][..], &["bench-role", "hog", "4096"]] {
        let out = vrange().args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "vrange {args:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("unrecognized subcommand"), "{err}");
    }
}

/// `vrange stat --watch` lines: "HH:MM:SS  elapsed  values...".
fn timestamped(line: &str) -> bool {
    let mut words = line.split_whitespace();
    let time = words.next().unwrap_or("");
    let elapsed = words.next().unwrap_or("");
    time.len() == 8
        && time
            .split(':')
            .all(|n| n.len() == 2 && n.parse::<u8>().is_ok())
        && elapsed.parse::<f64>().is_ok()
}

/// The lines of a `--watch` output after its header and rule, checking both.
fn watch_lines(text: &str) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    let header = lines
        .iter()
        .position(|l| l.split_whitespace().next() == Some("time"))
        .unwrap_or_else(|| panic!("no header:\n{text}"));
    for column in [
        "elapsed",
        "RSS",
        "LazyFree",
        "AnonHuge",
        "VmPTE",
        "volatile",
        "purged total",
    ] {
        assert!(
            lines[header].contains(column),
            "no {column} column:\n{text}"
        );
    }
    assert!(
        lines[header + 1].starts_with("---"),
        "no rule under the header:\n{text}"
    );
    lines[header + 2..].to_vec()
}

#[test]
fn stat_watch_prints_a_time_series() {
    let mut child = Command::new("sleep").arg("3600").spawn().unwrap();
    let pid = child.id().to_string();
    let t = Instant::now();
    let out = vrange()
        .args([
            "stat",
            &pid,
            "--watch",
            "--count",
            "3",
            "--interval",
            "200ms",
        ])
        .output()
        .unwrap();
    let took = t.elapsed();
    let _ = child.kill();
    let _ = child.wait();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    let lines = watch_lines(&text);
    assert_eq!(lines.len(), 3, "three lines:\n{text}");
    assert!(lines.iter().all(|l| timestamped(l)), "{text}");
    let elapsed: Vec<f64> = lines
        .iter()
        .map(|l| l.split_whitespace().nth(1).unwrap().parse().unwrap())
        .collect();
    assert!(elapsed.windows(2).all(|w| w[1] > w[0]), "{text}");
    assert!(took >= Duration::from_millis(400), "200 ms apart: {took:?}");
    // Aligned: every line as long as the header (numbers are right-aligned to its end).
    let header = text
        .lines()
        .find(|l| l.starts_with("    time"))
        .unwrap_or("");
    for l in &lines {
        assert_eq!(l.chars().count(), header.chars().count(), "{text}");
    }
}

#[test]
fn stat_watch_ends_when_the_process_exits() {
    use std::io::BufRead as _;
    let mut child = Command::new("sleep").arg("3600").spawn().unwrap();
    let pid = child.id().to_string();
    let mut watcher = vrange()
        .args(["stat", &pid, "--watch", "--interval", "100ms"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // The first sample (however late a busy machine starts the watcher), then the exit.
    let mut out = std::io::BufReader::new(watcher.stdout.take().unwrap());
    let mut text = String::new();
    while !text.lines().any(timestamped) {
        assert!(out.read_line(&mut text).unwrap() > 0, "{text}");
    }
    child.kill().unwrap();
    // Reap the child so that its pid goes away.
    let _ = child.wait();
    std::io::Read::read_to_string(&mut out, &mut text).unwrap();
    let status = watcher.wait().unwrap();
    assert!(status.success(), "{status:?}: {text}");
    let lines = watch_lines(&text);
    let last = lines.last().copied().unwrap_or("");
    assert!(
        timestamped(last) && last.ends_with(&format!("pid {pid} has exited")),
        "{text}"
    );
    assert!(lines.len() >= 2, "{text}");
}

#[test]
fn stat_watch_stops_on_sigint_with_a_last_line() {
    let mut child = Command::new("sleep").arg("3600").spawn().unwrap();
    let pid = child.id().to_string();
    let mut watcher = vrange();
    watcher
        .args(["stat", &pid, "--watch", "--interval", "100ms"])
        .stdout(Stdio::piped());
    // SIGINT as a terminal's user has it: a harness started in the background (a
    // non-interactive shell's `&`) passes it on ignored, and then the watcher rightly lives on.
    // SAFETY: signal() is async-signal-safe; the child only resets one disposition.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut watcher, || {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        })
    };
    let mut watcher = watcher.spawn().unwrap();
    let mut stdout = std::io::BufReader::new(watcher.stdout.take().unwrap());
    let mut text = String::new();
    while !text.lines().any(timestamped) {
        let mut line = String::new();
        if std::io::BufRead::read_line(&mut stdout, &mut line).unwrap() == 0 {
            break;
        }
        text.push_str(&line);
    }
    // SAFETY: kill has no memory preconditions; the pid is our own child's.
    unsafe { libc::kill(watcher.id() as i32, libc::SIGINT) };
    std::io::Read::read_to_string(&mut stdout, &mut text).unwrap();
    let status = watcher.wait().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(status.signal(), Some(libc::SIGINT), "{status:?}\n{text}");
    let last = text.lines().last().unwrap_or("");
    assert!(
        timestamped(last) && last.ends_with("interrupted (SIGINT)"),
        "{text}"
    );
}

#[test]
fn stat_rejects_bad_intervals() {
    for bad in ["2", "1.5s", "50ms", "2 s", "fast", "0s"] {
        let out = vrange()
            .args(["stat", "1", "--watch", "--interval", bad])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "--interval {bad:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--interval"), "{err}");
    }
    let out = vrange()
        .args(["stat", "1", "--count", "2"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "--count needs --watch: {out:?}");
}

/// This user's statistics directory, made as vrange makes it if it is missing.
fn own_stats_dir() -> std::path::PathBuf {
    use std::os::unix::fs::DirBuilderExt;
    // SAFETY: geteuid has no preconditions.
    let dir = std::path::PathBuf::from(format!("/dev/shm/vrange-{}", unsafe { libc::geteuid() }));
    let _ = std::fs::DirBuilder::new().mode(0o700).create(&dir);
    dir
}

/// A file left by a killed process whose pid now names another process is not believed (the
/// start time differs), and is removed, as is the file of a process that is gone.
#[test]
fn stat_ignores_a_stale_statistics_file() {
    let mut sleeper = Command::new("sleep").arg("3600").spawn().unwrap();
    let pid = sleeper.id();
    let dead = {
        let mut c = Command::new("true").spawn().unwrap();
        c.wait().unwrap();
        c.id()
    };
    let dir = own_stats_dir();
    let path = dir.join(format!("vrange-{pid}.stats"));
    let dead_path = dir.join(format!("vrange-{dead}.stats"));
    for (p, n) in [(&path, pid), (&dead_path, dead)] {
        std::fs::write(
            p,
            format!("pid={n}\nstart_ticks=1\nvolatile_bytes=123456789\n"),
        )
        .unwrap();
    }
    let out = vrange().args(["stat", &pid.to_string()]).output().unwrap();
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("no statistics published"), "{text}");
    assert!(!path.exists(), "the stale file is removed");
    assert!(
        !dead_path.exists(),
        "the file of a process that is gone is removed"
    );

    // `vrange stat` on a process that is gone clears the directory too.
    std::fs::write(&dead_path, format!("pid={dead}\nstart_ticks=1\n")).unwrap();
    let out = vrange().args(["stat", &dead.to_string()]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(!dead_path.exists(), "removed by stat on a dead pid");
}

/// `vrange run --stats` makes a fresh private directory with a name nobody can guess: links
/// planted at the names the old `$TMPDIR/vrange-run-<pid>` scheme would use change nothing,
/// and the directory is gone afterwards.
#[test]
fn run_stats_uses_a_fresh_private_directory() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !std::path::Path::new(PYTHON).exists() {
        return skip(format!("{PYTHON} missing"));
    }
    let scratch = tempfile::Builder::new()
        .prefix("vrange-cli-tmp-")
        .tempdir()
        .unwrap();
    // A stand-in for /tmp: world-writable and sticky.
    let tmp = scratch.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let victims = scratch.path().join("victims");
    std::fs::create_dir(&victims).unwrap();
    std::fs::write(victims.join("victim"), "victim").unwrap();
    let last = vrange_sys::procfs::last_pid().unwrap_or(1);
    let mut planted = Vec::new();
    for p in last + 1..last + 400 {
        let name = format!("vrange-run-{p}");
        std::os::unix::fs::symlink(&victims, tmp.join(&name)).unwrap();
        planted.push(format!("l {name}"));
    }
    let script = "b = [bytearray(1 << 20) for _ in range(8)]\nprint('done')";
    let out = vrange()
        .env("TMPDIR", &tmp)
        .args(["run", "--stats", "--lib"])
        .arg(lib())
        .args([
            "--",
            "sh",
            "-c",
            "stat -c 'dir %a %u %n' \"$VRANGE_STATS_DIR\" && exec \"$0\" -c \"$1\"",
        ])
        .args([PYTHON, script])
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stderr.contains("1 process published vrange statistics"),
        "{stderr}"
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("dir "))
        .unwrap_or_else(|| panic!("{stdout}"));
    let mut words = line.split(' ').skip(1);
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() }.to_string();
    assert_eq!(
        (words.next(), words.next()),
        (Some("700"), Some(me.as_str())),
        "{line}"
    );
    let used = std::path::PathBuf::from(words.next().unwrap());
    assert_eq!(used.parent(), Some(tmp.as_path()), "{line}");
    let name = used.file_name().unwrap().to_string_lossy().to_string();
    assert!(
        name.starts_with("vrange-run-") && !planted.contains(&format!("l {name}")),
        "{line}"
    );
    // Only the planted links are left, and the victims directory holds only its own file.
    let mut left: Vec<String> = std::fs::read_dir(&tmp)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let kind = if e.file_type().unwrap().is_symlink() {
                "l"
            } else {
                "?"
            };
            format!("{kind} {}", e.file_name().to_string_lossy())
        })
        .collect();
    left.sort();
    planted.sort();
    assert_eq!(left, planted, "the statistics directory is removed");
    let in_victims: Vec<_> = std::fs::read_dir(&victims)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(in_victims, ["victim"]);
    assert_eq!(
        std::fs::read_to_string(victims.join("victim")).unwrap(),
        "victim"
    );
    assert_eq!(std::fs::metadata(&victims).unwrap().nlink(), 2);
}

#[test]
fn man_writes_a_page_per_visible_subcommand() {
    let dir = tempfile::tempdir().unwrap();
    let out = vrange().arg("man").arg(dir.path()).output().unwrap();
    assert!(out.status.success(), "vrange man failed: {out:?}");
    let mut pages: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    pages.sort();
    // Hidden subcommands (man itself) get none.
    let expected = [
        "vrange-daemon.1",
        "vrange-demo.1",
        "vrange-features.1",
        "vrange-run.1",
        "vrange-stat.1",
        "vrange-top.1",
        "vrange.1",
    ];
    assert_eq!(pages, expected);
    let top = std::fs::read_to_string(dir.path().join("vrange.1")).unwrap();
    assert!(top.contains(".TH vrange 1"), "{top}");
    assert!(
        top.contains(".BR vrange (3)"),
        "SEE ALSO names the C library:\n{top}"
    );
    let run = std::fs::read_to_string(dir.path().join("vrange-run.1")).unwrap();
    assert!(run.contains("\\-\\-budget"), "{run}");
}

/// `vrange run` without --lib finds the shim as `make install` lays it out ($PREFIX/bin/vrange,
/// $PREFIX/lib/libvrange_malloc.so), and says where it looked when it is in neither place.
#[test]
fn run_finds_the_shim_in_the_installed_layout() {
    let prefix = tempfile::tempdir().unwrap();
    let (bin, libdir) = (prefix.path().join("bin"), prefix.path().join("lib"));
    std::fs::create_dir(&bin).unwrap();
    let exe = bin.join("vrange");
    std::fs::copy(env!("CARGO_BIN_EXE_vrange"), &exe).unwrap();
    let preload = || {
        let mut c = Command::new(&exe);
        c.args(["run", "--", "sh", "-c", "printf %s \"$LD_PRELOAD\""])
            .env_remove("LD_PRELOAD");
        c.output().unwrap()
    };
    let missing = preload();
    assert_eq!(missing.status.code(), Some(127), "{missing:?}");
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("../lib"),
        "{missing:?}"
    );
    std::fs::create_dir(&libdir).unwrap();
    std::fs::copy(lib(), libdir.join("libvrange_malloc.so")).unwrap();
    let found = preload();
    assert!(found.status.success(), "{found:?}");
    assert_eq!(
        String::from_utf8_lossy(&found.stdout),
        libdir.join("libvrange_malloc.so").to_string_lossy()
    );
}

/// A `vrange daemon` started with `args`, and what it printed on stderr up to its startup line
/// (printed once it listens).
fn daemon_started(args: &[&str]) -> (std::process::Child, String) {
    use std::io::BufRead;
    let mut child = vrange()
        .arg("daemon")
        .args(args)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    while !line.contains(": coordinating ") && err.read_line(&mut line).unwrap() > 0 {}
    // Keep reading in the background so that the daemon never blocks on a full pipe.
    std::thread::spawn(move || std::io::copy(&mut err, &mut std::io::sink()));
    (child, line)
}

fn stop(mut daemon: std::process::Child) {
    // SAFETY: kill(2) on our child.
    assert_eq!(unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) }, 0);
    assert!(daemon.wait().unwrap().success());
}

fn mem_total() -> u64 {
    vrange_sys::procfs::meminfo_kb("MemTotal").unwrap().unwrap() << 10
}

/// Issue 20: `--headroom 300G` for `300M` turned the daemon into a purge-everything loop
/// without a word. At or above the limit it is refused (exit 2, one line, nothing bound);
/// above half the limit the daemon runs and warns once.
#[test]
fn daemon_refuses_a_headroom_at_the_limit_and_warns_above_half() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("coordinator.sock");
    let total = mem_total();
    for headroom in [total, total * 2] {
        let out = vrange()
            .args(["daemon", "--machine", "--headroom", &headroom.to_string()])
            .arg("--socket")
            .arg(&socket)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(err.contains("headroom") && err.contains("limit"), "{err}");
        assert!(!err.contains("coordinating"), "{err}");
        assert!(!socket.exists(), "nothing bound");
    }
    let (daemon, first) = daemon_started(&[
        "--machine",
        "--headroom",
        &(total / 4 * 3).to_string(),
        "--socket",
        socket.to_str().unwrap(),
    ]);
    let lines: Vec<&str> = first.lines().collect();
    assert_eq!(
        lines.len(),
        2,
        "one warning, then the startup line: {first}"
    );
    assert!(lines[0].starts_with("vrange daemon: warning: "), "{first}");
    assert!(lines[0].contains("half the limit"), "{first}");
    stop(daemon);
}

/// Issue 20: a missing cgroup was first announced as coordinated, then rejected. It is a
/// usage error now, found before anything is bound or announced.
#[test]
fn daemon_checks_the_cgroup_before_announcing_it() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("coordinator.sock");
    let out = vrange()
        .args([
            "daemon",
            "--cgroup",
            "/nonexistent/vrange-cgroup",
            "--socket",
        ])
        .arg(&socket)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(
        err,
        "vrange daemon: /nonexistent/vrange-cgroup is not a memory cgroup\n"
    );
    assert!(!socket.exists());
}

/// Issue 20: the startup line printed `Tcp(127.0.0.1:9464)` and "Address already in use" did
/// not say whether the metrics port or the socket was taken.
#[test]
fn daemon_prints_addresses_and_says_which_one_is_in_use() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("coordinator.sock");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics = format!("127.0.0.1:{port}");
    let (daemon, first) = daemon_started(&[
        "--machine",
        "--socket",
        socket.to_str().unwrap(),
        "--metrics",
        &metrics,
    ]);
    assert_eq!(
        first,
        format!(
            "vrange daemon: coordinating the machine at {}, metrics at {metrics}\n",
            socket.display()
        )
    );
    let unix = dir.path().join("metrics.sock");
    let other = dir.path().join("other.sock");
    let taken_port = vrange()
        .args(["daemon", "--machine", "--socket"])
        .arg(&other)
        .args(["--metrics", &metrics])
        .output()
        .unwrap();
    let taken_socket = vrange()
        .args(["daemon", "--machine", "--socket"])
        .arg(&socket)
        .arg("--metrics")
        .arg(format!("unix:{}", unix.display()))
        .output()
        .unwrap();
    stop(daemon);
    let err = String::from_utf8_lossy(&taken_port.stderr);
    assert_eq!(taken_port.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with(&format!("vrange daemon: metrics at {metrics}: ")),
        "{err}"
    );
    assert!(!err.contains("coordinating"), "{err}");
    assert!(!other.exists(), "the socket bound before is removed");
    let err = String::from_utf8_lossy(&taken_socket.stderr);
    assert_eq!(taken_socket.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with(&format!("vrange daemon: socket {}: ", socket.display())),
        "{err}"
    );
    let (daemon, first) = daemon_started(&[
        "--machine",
        "--socket",
        socket.to_str().unwrap(),
        "--metrics",
        &format!("unix:{}", unix.display()),
    ]);
    assert!(
        first.ends_with(&format!(", metrics at unix:{}\n", unix.display())),
        "{first}"
    );
    // A second daemon does not take over the first one's metrics socket.
    let taken_unix = vrange()
        .args(["daemon", "--machine", "--socket"])
        .arg(&other)
        .arg("--metrics")
        .arg(format!("unix:{}", unix.display()))
        .output()
        .unwrap();
    let unix_kept = unix.exists();
    stop(daemon);
    let err = String::from_utf8_lossy(&taken_unix.stderr);
    assert_eq!(taken_unix.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with(&format!(
            "vrange daemon: metrics at unix:{}: ",
            unix.display()
        )),
        "{err}"
    );
    assert!(unix_kept, "the first daemon's metrics socket is left alone");
    assert!(!unix.exists(), "removed when the daemon stops");
}

/// `vrange daemon` serves `vrange top` and Prometheus metrics, and on SIGTERM exits 0 and removes
/// its socket; a metrics address off loopback is a usage error.
#[test]
fn daemon_top_and_metrics() {
    let bad = vrange()
        .args(["daemon", "--machine", "--metrics", "0.0.0.0:9464"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("loopback"));

    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("coordinator.sock");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut daemon = vrange()
        .args(["daemon", "--machine", "--socket"])
        .arg(&socket)
        .args(["--metrics", &format!("127.0.0.1:{port}")])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !socket.exists() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let top = vrange()
        .args(["top", "--once", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&top.stdout);
    assert!(top.status.success(), "{top:?}");
    assert!(text.contains("0 participants"), "{text}");
    assert!(text.contains("VOLATILE MiB"), "{text}");
    assert!(
        !text.contains("proactive:"),
        "the mode is off by default: {text}"
    );
    let metrics = {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        out
    };
    assert!(metrics.starts_with("HTTP/1.1 200 OK"), "{metrics}");
    assert!(
        metrics.contains("vrange_coordinator_participants 0"),
        "{metrics}"
    );
    // SAFETY: kill(2) on our child.
    assert_eq!(unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) }, 0);
    let status = daemon.wait().unwrap();
    assert!(status.success(), "{status:?}");
    assert!(!socket.exists(), "the socket is removed");
    let missing = vrange()
        .args(["top", "--once", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(1));
}

/// `vrange daemon --proactive`: its options need the flag and are checked (exit 2, nothing
/// bound), and `vrange top` says what the mode did.
#[test]
fn daemon_proactive_options_and_top() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("coordinator.sock");
    for args in [
        &["--proactive-age", "5s"][..],
        &["--proactive", "--proactive-stall", "101"],
        &["--proactive", "--proactive-step", "0"],
        &["--proactive", "--proactive-age", "5"],
    ] {
        let out = vrange()
            .args(["daemon", "--machine", "--socket"])
            .arg(&socket)
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains("--proactive"), "{args:?}: {err}");
        assert!(!socket.exists(), "nothing bound");
    }
    let (daemon, first) = daemon_started(&[
        "--machine",
        "--proactive",
        "--proactive-age",
        "2s",
        "--socket",
        socket.to_str().unwrap(),
    ]);
    let top = vrange()
        .args(["top", "--once", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    // Stopped before any assertion: a daemon left running would hold the test's output open.
    stop(daemon);
    assert!(first.contains("coordinating the machine"), "{first}");
    let text = String::from_utf8_lossy(&top.stdout);
    assert!(top.status.success(), "{top:?}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("proactive: saved ") && l.contains(" stalls ")),
        "{text}"
    );
}

/// `vrange top` shows the shared regions the coordinator holds, each once, with their bytes by
/// state in every process: a participant shares a 4 MiB region and unpins half of it.
#[test]
fn top_shows_the_shared_regions_the_coordinator_holds() {
    use vrange_testkit::role::{command, role, role_command, say, Role};
    if role().is_some() {
        let opts = vrange::Options {
            shared: true,
            ..vrange::Options::default()
        };
        let r = vrange::VolatileRegion::new(4 << 20, opts).expect("shared region");
        // SAFETY: nothing refers into the range while it is volatile.
        unsafe { r.mark_range(0, 2 << 20) }.expect("mark_range");
        say(format_args!(
            "SHARING ino={}",
            std::fs::metadata(format!(
                "/proc/self/fd/{}",
                std::os::fd::AsRawFd::as_raw_fd(&r.shared_fd().unwrap())
            ))
            .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
            .unwrap_or(0)
        ));
        while command().is_some() {}
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("coordinator.sock");
    let (daemon, _) = daemon_started(&["--machine", "--socket", socket.to_str().unwrap()]);
    let mut cmd = role_command(
        "top_shows_the_shared_regions_the_coordinator_holds",
        "sharer",
    );
    cmd.env("VRANGE_COORDINATOR", &socket);
    let mut sharer = Role::spawn("sharer", cmd);
    let ino = sharer.expect("SHARING", Duration::from_secs(20)).u64("ino");
    let t0 = Instant::now();
    let text = loop {
        let top = vrange()
            .args(["top", "--once", "--socket"])
            .arg(&socket)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&top.stdout).to_string();
        let row = text
            .lines()
            .find(|l| l.split_whitespace().next() == Some(&ino.to_string()));
        if row.is_some_and(|r| {
            r.split_whitespace().collect::<Vec<_>>()[1..5] == ["4.0", "2.0", "2.0", "0.0"]
        }) || t0.elapsed() > Duration::from_secs(20)
        {
            break text;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    sharer.close_stdin();
    stop(daemon);
    assert!(text.contains("SHARED INODE"), "{text}");
    let row: Vec<&str> = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(&ino.to_string()))
        .unwrap_or_else(|| panic!("no row for inode {ino}: {text}"))
        .split_whitespace()
        .collect();
    assert_eq!(
        row[1..],
        ["4.0", "2.0", "2.0", "0.0", "1", "1"],
        "size, volatile, pinned, purged MiB, holders, participants: {text}"
    );
}

/// Issue 20: `vrange stat 1` as root said "run as that user or as root". Where root may not
/// read pid 1 (a sandbox's init holding capabilities root lacks, a security module), the
/// message says what the kernel's check saw instead.
#[test]
fn stat_as_root_refused_names_the_ptrace_check_not_root() {
    if !is_root() {
        return skip("needs root");
    }
    let out = vrange().args(["stat", "1"]).output().unwrap();
    if out.status.success() {
        // Root may read pid 1 here: nothing to check. No portable way makes the kernel refuse
        // root; the nobody case above covers the rule for another user's process.
        return;
    }
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(!err.contains("run as that user or as root"), "{err}");
    assert!(err.contains("ptrace access check"), "{err}");
    assert!(err.contains("pid 1 runs as uid 0"), "{err}");
    assert!(err.contains("CAP_SYS_PTRACE"), "{err}");
}

/// Issue 20: `vrange run --lib /nonexistent.so -- true` exited 0 and ran the program without
/// vrange (the loader only warns). A --lib that is not a loadable shim is a usage error.
#[test]
fn run_lib_that_is_not_the_shim_is_a_usage_error() {
    for bad in [
        std::path::PathBuf::from("/nonexistent.so"),
        std::path::PathBuf::from("/etc/passwd"),
        std::path::PathBuf::from(env!("CARGO_BIN_EXE_vrange")),
    ] {
        let out = vrange()
            .args(["run", "--lib"])
            .arg(&bad)
            .args(["--", "sh", "-c", "echo ran"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(&*bad.to_string_lossy()), "{err}");
        assert!(out.stdout.is_empty(), "the program ran: {out:?}");
    }
    let good = vrange()
        .args(["run", "--lib"])
        .arg(lib())
        .args(["--", "sh", "-c", "echo ran"])
        .output()
        .unwrap();
    assert!(good.status.success(), "{good:?}");
}

/// Issue 20: `VRANGE_MALLOC_MODE=lazy vrange run -- prog` ran in hybrid, and `=bogus` was
/// replaced silently: --mode's default overrode the documented variable.
#[test]
fn run_keeps_vrange_malloc_mode_from_the_environment_unless_mode_is_given() {
    let mode = |env: Option<&str>, flag: Option<&str>| {
        let mut c = vrange();
        c.arg("run");
        if let Some(f) = flag {
            c.args(["--mode", f]);
        }
        c.arg("--lib")
            .arg(lib())
            .args(["--", "sh", "-c", "printf %s \"$VRANGE_MALLOC_MODE\""]);
        if let Some(e) = env {
            c.env("VRANGE_MALLOC_MODE", e);
        }
        let out = c.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert_eq!(mode(Some("lazy"), None).0, "lazy");
    assert_eq!(mode(Some("lazy"), Some("managed")).0, "managed");
    assert_eq!(mode(None, None).0, "hybrid");
    let (seen, err) = mode(Some("bogus"), None);
    assert_eq!(seen, "bogus", "left for the allocator to judge");
    assert!(
        err.contains("VRANGE_MALLOC_MODE=bogus is not valid"),
        "the allocator's usual warning: {err}"
    );
}
