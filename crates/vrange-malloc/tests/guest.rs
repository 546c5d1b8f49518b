//! vrange-malloc as a guest in programs it did not write: it must never touch their
//! descriptors, and must refuse an impossible request the way glibc does instead of getting the
//! program OOM-killed later. Each case is a regression test for a defect seen with the shim:
//!
//! - a program that closed 3..63, opened files and kept allocating had vrange's eventfd writes
//!   land in its first file, and its fork child closed the program's file by number;
//! - a program that closed 1 and restored it with `dup2` while the reclaimer opened files had
//!   its `dup2` fail with EBUSY, or its restored stdout closed by vrange's check-then-close
//!   (the reclaimer now works in a descriptor table of its own);
//! - a process started with 0 and 1 closed had vrange's descriptors become 0 and 1, so its
//!   `write(1)` got EBUSY instead of EBADF;
//! - one 64 KiB allocation opened six descriptors, none of them needed yet;
//! - `malloc(more than memory and swap)` succeeded (MAP_NORESERVE), and Python's
//!   `bytearray(1 << 40)` in a 1 GiB memory cgroup was OOM-killed instead of raising
//!   MemoryError.

// ci: guest 6.1 only: the allocator on 6.12 takes the host's paths but PT_RECLAIM's, and 6.1 has every fallback

mod common;
use common::*;
use std::process::Command;
use std::sync::OnceLock;
use vrange_sys::cgroup::join_before_exec;
use vrange_testkit::cgroup;
use vrange_testkit::proc::{output, show};
use vrange_testkit::scratch::Scratch;
use vrange_testkit::{missing, skip};

const PYTHON: &str = "/usr/bin/python3";

/// The guest program, compiled once.
fn guest() -> &'static std::path::Path {
    static BIN: OnceLock<(Scratch, std::path::PathBuf)> = OnceLock::new();
    &BIN.get_or_init(|| {
        let dir = Scratch::new("guest-bin");
        let bin = dir.join("guest");
        compile("guest.c", &bin, &[]);
        (dir, bin)
    })
    .1
}

fn assert_ok(label: &str, cmd: &Command, out: &std::process::Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.lines().any(|l| l == "ok"),
        "{label}: {cmd:?} ended with {}\n{}",
        out.status,
        show(out)
    );
}

#[test]
fn closed_and_reused_descriptors_are_never_written_or_closed() {
    let dir = Scratch::new("guest-closefrom");
    let mut cmd = Command::new(guest());
    cmd.arg("closefrom")
        .arg(dir.path())
        // Purges keep waking the reclaimer (writes to its eventfd), while enough free memory
        // stays volatile for it to open its sources in the first place.
        .env("VRANGE_MALLOC_BUDGET", "8M")
        // Short ticks: the reclaimer notices the closed sources within the churn.
        .env("VRANGE_POLL_MS", "20");
    let out = output(with_shim(&mut cmd, &[]));
    assert_ok("closefrom under the shim", &cmd, &out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let sums = summaries(&stderr);
    assert!(
        sums.len() == 2 && sums.iter().all(|s| s.allocations > 100),
        "the shim did not serve the churn of both processes\n{}",
        show(&out)
    );
    assert!(
        sums.iter().any(|s| s.purged_mib > 0.0),
        "the reclaimer never purged, so its descriptors were never exercised\n{}",
        show(&out)
    );
    // The program closed everything from 3 twice (closefrom, close_range). The reclaimer keeps
    // its descriptors in a table of its own, which those calls cannot reach: nothing of
    // vrange's was lost. Where the kernel refuses it such a table they are in the program's,
    // and vrange must have noticed their loss and said so in the summary.
    let own_table = vrange::features().own_table.is_ok();
    assert_eq!(
        stderr.contains("descriptors closed under vrange by the program"),
        !own_table,
        "own descriptor table: {own_table}\n{}",
        show(&out)
    );
    let mut plain = Command::new(guest());
    plain.arg("closefrom").arg(dir.path());
    let out = output(without_shim(&mut plain));
    assert_ok("closefrom without the shim", &plain, &out);
}

/// Regression (CPython's test_subprocess under the shim with VRANGE_MALLOC_THRESHOLD=16K, in
/// CI: the worker's stdout closed): a program closes 1 and restores it with dup2 while the
/// reclaimer opens files; a file of vrange's that landed at 1 in between was then closed by
/// number after the program had put its stdout back there.
#[test]
fn a_standard_descriptor_closed_and_restored_meanwhile_is_never_closed() {
    let mut cmd = Command::new(guest());
    cmd.args(["stdswap", "4"])
        // Ticks as fast as they go: the reclaimer opens and closes as often as it ever does.
        .env("VRANGE_POLL_MS", "1")
        .env("VRANGE_MALLOC_THRESHOLD", "16K")
        .env("VRANGE_MALLOC_BUDGET", "4M");
    let out = output(with_shim(&mut cmd, &[]));
    assert_ok("stdswap under the shim", &cmd, &out);
}

#[test]
fn no_descriptor_before_volatile_memory_and_then_only_above_the_floor() {
    let floor = vrange_sys::fd::floor();
    let mut cmd = Command::new(guest());
    cmd.arg("lazyfds").arg(floor.to_string());
    with_shim(&mut cmd, &[]).env_remove("VRANGE_MALLOC_STATS");
    let out = output(&mut cmd);
    assert_ok("lazyfds under the shim", &cmd, &out);
}

#[test]
fn a_program_started_with_stdin_and_stdout_closed_keeps_them_closed() {
    if let Some(why) = missing(&[PYTHON]) {
        return skip(why);
    }
    let dir = Scratch::new("guest-closed-std");
    let report = dir.join("report");
    // Large buffers churned (the reclaimer starts and opens its sources), then fds 0 and 1 must
    // still be closed: EBADF, not one of vrange's descriptors.
    let prog = r#"
import errno, os, sys
keep = []
for i in range(400):
    b = bytearray((64 << 10) << (i % 6))
    b[0] = 1
    keep.append(b)
    if len(keep) > 4:
        keep.pop(0)
del keep
import time; time.sleep(0.3)
out = []
for fd in (0, 1):
    try:
        os.fstat(fd)
        out.append(f"fd {fd} is open: {os.readlink(f'/proc/self/fd/{fd}')}")
    except OSError as e:
        out.append(f"fd {fd} {errno.errorcode[e.errno]}")
try:
    os.write(1, b"x")
    out.append("write(1) succeeded")
except OSError as e:
    out.append(f"write(1) {errno.errorcode[e.errno]}")
with open(sys.argv[1], "w") as f:
    f.write("\n".join(out) + "\n")
"#;
    let script = dir.join("closed.py");
    std::fs::write(&script, prog).unwrap();
    let run = |shim: bool| {
        let _ = std::fs::remove_file(&report);
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg(format!(
                "exec {PYTHON} {} {} 0<&- 1>&-",
                script.display(),
                report.display()
            ))
            .env("VRANGE_MALLOC_BUDGET", "1M");
        if shim {
            with_shim(&mut cmd, &[]);
        } else {
            without_shim(&mut cmd);
        }
        let out = output(&mut cmd);
        assert!(out.status.success(), "{cmd:?}\n{}", show(&out));
        let text = std::fs::read_to_string(&report).unwrap_or_default();
        (text, out)
    };
    let (plain, _) = run(false);
    let (shimmed, out) = run(true);
    assert_eq!(
        plain, "fd 0 EBADF\nfd 1 EBADF\nwrite(1) EBADF\n",
        "without the shim"
    );
    assert_eq!(shimmed, plain, "under the shim\n{}", show(&out));
    let served: u64 = summaries(&String::from_utf8_lossy(&out.stderr))
        .iter()
        .map(|s| s.allocations)
        .sum();
    assert!(served > 0, "the shim served nothing\n{}", show(&out));
}

#[test]
fn a_request_larger_than_memory_fails_with_enomem() {
    let mut cmd = Command::new(guest());
    cmd.arg("enomem");
    let out = output(with_shim(&mut cmd, &[]));
    assert_ok("enomem under the shim", &cmd, &out);
    let mut plain = Command::new(guest());
    plain.arg("enomem");
    let out = output(without_shim(&mut plain));
    assert_ok("enomem with glibc", &plain, &out);
}

#[test]
fn python_raises_memory_error_in_a_small_cgroup() {
    if let Some(why) = missing(&[PYTHON]) {
        return skip(why);
    }
    let child = match cgroup::child("vrange-malloc-enomem-", 1 << 30) {
        Ok(c) => c,
        Err(why) => return skip(why),
    };
    let prog = "try:\n    b = bytearray(1 << 40)\n    print('allocated')\nexcept MemoryError:\n    print('MemoryError')\n";
    for shim in [false, true] {
        let mut cmd = Command::new(PYTHON);
        shim_if(cmd.args(["-c", prog]), shim);
        join_before_exec(&mut cmd, &child.cgroup().file("cgroup.procs")).expect("join");
        let out = output(&mut cmd);
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout) == "MemoryError\n",
            "shim {shim}: {cmd:?} ended with {}\n{}",
            out.status,
            show(&out)
        );
    }
    assert_eq!(child.cgroup().oom_kills().unwrap_or(0), 0);
}

/// A real program in a container as Docker runs it by default (its seccomp profile refuses
/// userfaultfd, process_madvise and unshare; no CAP_SYS_RESOURCE; the cgroup file system
/// read-only): under the shim it prints exactly what it prints without, and the shim served
/// and purged its blocks (its reclaimer in a descriptor table of its own, close_range being
/// allowed there).
#[test]
fn a_program_in_a_docker_container_runs_the_same_under_the_shim() {
    use vrange_testkit::confine::Confinement;
    if let Some(why) = missing(&[PYTHON]) {
        return skip(why);
    }
    if !vrange_testkit::is_root() {
        return skip("needs root to confine a child as Docker does");
    }
    // Megabyte buffers made, hashed and dropped: the shim's blocks, freed into volatile
    // memory the budget then purges.
    let script = "import hashlib\n\
        h = hashlib.sha256()\n\
        keep = []\n\
        for i in range(400):\n\
        \x20   b = bytearray((i % 251,)) * ((1 << 20) + i * 4096)\n\
        \x20   h.update(b[::4096])\n\
        \x20   keep.append(b)\n\
        \x20   if len(keep) > 8: keep.pop(0)\n\
        print(h.hexdigest())\n";
    let run = |shim: bool| {
        let scratch = Scratch::new("guest-docker");
        let mut cmd = Command::new(PYTHON);
        cmd.args(["-c", script]);
        shim_if(&mut cmd, shim).env("VRANGE_MALLOC_BUDGET", "8M");
        Confinement::Docker.apply(&mut cmd, &scratch);
        let out = output(&mut cmd);
        assert!(out.status.success(), "shim {shim}: {}", show(&out));
        out
    };
    let plain = run(false);
    let shimmed = run(true);
    assert_eq!(
        String::from_utf8_lossy(&shimmed.stdout),
        String::from_utf8_lossy(&plain.stdout),
        "the program's output differs under the shim"
    );
    let sums = summaries(&String::from_utf8_lossy(&shimmed.stderr));
    assert!(
        sums.len() == 1 && sums[0].allocations >= 400 && sums[0].purged_mib > 0.0,
        "the shim did not serve and purge the program's blocks\n{}",
        show(&shimmed)
    );
}
