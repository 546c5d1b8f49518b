//! The proactive mode on the real kernel, in a child memory cgroup far from its limit (no
//! pressure at all): a participant's volatile chunks idle longer than the mode's age are purged
//! before anyone asks, and its usage falls by them; younger chunks (of the low class, which an
//! ordinary cut would take first) and pinned ones stay, byte for byte; the participant learns
//! of each purge exactly. Without the mode (the default)
//! nothing is purged, and turned off after it ran, nothing more. On cgroup v1 (the host, the
//! 6.1 guest) and v2 (the 6.12 guest) alike; on v2 a step also takes page cache through
//! `memory.reclaim`.
//! The controller's holds (a stall, pressure, refaults) are decided by a pure function, tested
//! with made-up readings in the crate.

mod common;

use common::*;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use vrange_coordinator::Proactive;
use vrange_sys::cgroup::{ChildCgroup, MemCgroup};
use vrange_testkit::role::{Reply, Role};
use vrange_testkit::{cgroup, serial, skip};

const LIMIT: u64 = 256 << 20;
/// The mode's age in these tests: long enough that chunks marked after the old ones are
/// still younger when the old ones go, on a busy emulated machine.
const AGE: Duration = Duration::from_secs(6);
const OLD: usize = 4;
const YOUNG: usize = 2;

/// A child cgroup of `LIMIT` and a socket directory for a test (`None` after a skip).
fn place(tag: &str) -> Option<(ChildCgroup, MemCgroup, SocketDir, PathBuf)> {
    let child = match cgroup::child(&format!("vrange-proactive-{tag}-"), LIMIT) {
        Ok(c) => c,
        Err(why) => {
            skip(why);
            return None;
        }
    };
    let cg = child.cgroup().clone();
    let dir = socket_dir(&format!("proactive-{tag}"));
    let socket = dir.join("coordinator.sock");
    Some((child, cg, dir, socket))
}

fn command(p: &mut Role, cmd: &str, tag: &str) -> Reply {
    assert!(p.send(cmd));
    let r = p
        .next(ANSWER)
        .unwrap_or_else(|e| panic!("no answer to {cmd}: {e}"));
    assert_eq!(r.tag, tag, "{cmd}");
    r
}

/// Marks `OLD` chunks and a pinned one, waits `AGE`, marks `YOUNG` more of the low class
/// (before the old ones in the victim order); returns the participant, when the young ones
/// were marked, and the cgroup's usage once the old ones were (the mode may purge them before
/// the young ones come).
fn old_and_young(test: &str, cg: &MemCgroup, socket: &str) -> (Role, Instant, u64) {
    let mut p = spawn(
        test,
        "participant",
        cg,
        &[("VRANGE_COORDINATOR", socket.to_string())],
    );
    for _ in 0..OLD {
        command(&mut p, "mark", "MARKED");
    }
    command(&mut p, "pin", "PINNED");
    let usage = cg.usage().expect("usage");
    std::thread::sleep(AGE + Duration::from_millis(500));
    let young = Instant::now();
    for _ in 0..YOUNG {
        command(&mut p, "mark-low", "MARKED");
    }
    (p, young, usage)
}

#[test]
fn cold_volatile_memory_goes_back_before_anyone_asks_and_young_memory_stays() {
    if participant_role() {
        return;
    }
    let _s = serial();
    let test = "cold_volatile_memory_goes_back_before_anyone_asks_and_young_memory_stays";
    let Some((child, cg, _dir, socket)) = place("on") else {
        return;
    };
    let coordinator = InProcess::start(vrange_coordinator::Options {
        proactive: Some(Proactive {
            min_idle: AGE,
            interval: Duration::from_millis(200),
            // Any stall holds the mode (the machine's, on v1): these tests run beside others
            // and under emulation. The holds are the controller's unit tests.
            stall_pct: 100.0,
            ..Proactive::default()
        }),
        ..options(&socket, cg.path())
    });
    let (mut p, young, usage_before) = old_and_young(test, &cg, &socket.display().to_string());
    await_participants(&socket, 1, ANSWER).expect("the participant connects");
    // The old chunks go within the young ones' age; the young ones are still young then.
    let report = loop {
        let r = command(&mut p, "report", "REPORT");
        let bits = purged_bits(&r);
        if bits[..OLD].iter().all(|&b| b) {
            break r;
        }
        assert!(
            young.elapsed() < AGE,
            "the old chunks were not all purged while the young ones were young: {bits:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let bits = purged_bits(&report);
    assert!(
        young.elapsed() < AGE,
        "the report came after the young ones aged: {bits:?}"
    );
    assert_eq!(
        bits[OLD..],
        [false; YOUNG],
        "young chunks are never candidates"
    );
    assert_eq!(
        report.u64("pinned_ok"),
        1,
        "a pinned chunk keeps every byte"
    );
    // The young chunks came since; the old ones went.
    let usage_after = cg.usage().expect("usage");
    let freed = (usage_before + (YOUNG * CHUNK) as u64).saturating_sub(usage_after);
    assert!(
        freed >= (OLD * CHUNK) as u64 * 3 / 4,
        "the cgroup holds less by the old chunks: {} MiB freed ({} MiB with the old chunks, \
         {} MiB of young ones added, {} MiB now)",
        freed >> 20,
        usage_before >> 20,
        (YOUNG * CHUNK) >> 20,
        usage_after >> 20
    );
    // The answers are counted at the coordinator's next tick. Under real pressure (an
    // emulated guest beside a busy host, whose global reclaim stalls every cgroup), the
    // participant asks for room, a round purges the old chunks first (the same order) and the
    // mode holds on the stall: then the rounds' bytes count for them.
    let old = (OLD * CHUNK) as u64;
    let deadline = Instant::now() + ANSWER;
    let status = loop {
        let (status, _) = vrange_coordinator::query(&socket).expect("query");
        assert_eq!(status.proactive, 1);
        let asked = status.requests > 0;
        if status.proactive_saved >= old
            || (asked && status.proactive_saved.saturating_add(status.freed) >= old)
        {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the mode counts what it freed: {status:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let metrics = coordinator.shared.metrics();
    let saved = metrics
        .lines()
        .find_map(|l| l.strip_prefix("vrange_proactive_saved_bytes_total "))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no saved bytes in the metrics:\n{metrics}"));
    assert!(
        saved >= status.proactive_saved as f64 && (saved >= old as f64 || status.requests > 0),
        "{saved} saved by the metrics, {status:?}"
    );
    // The young chunks turn old and go too: the mode keeps stepping while quiet.
    let deadline = Instant::now() + ANSWER;
    loop {
        let r = command(&mut p, "report", "REPORT");
        if purged_bits(&r).iter().all(|&b| b) {
            assert_eq!(r.u64("pinned_ok"), 1);
            break;
        }
        assert!(Instant::now() < deadline, "the young chunks never went");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Turned off (the daemon started again without `--proactive`): what turns cold from then
    // on stays until pressure, as if the mode had never run.
    drop(coordinator);
    let coordinator = InProcess::start(options(&socket, cg.path()));
    for _ in 0..OLD {
        command(&mut p, "mark", "MARKED");
    }
    await_participants(&socket, 1, ANSWER).expect("the participant connects again");
    std::thread::sleep(AGE + Duration::from_secs(2));
    let r = command(&mut p, "report", "REPORT");
    assert_eq!(
        purged_bits(&r)[OLD + YOUNG..],
        [false; OLD],
        "nothing cold goes once the mode is off"
    );
    let (status, _) = vrange_coordinator::query(&socket).expect("query");
    assert_eq!((status.proactive, status.proactive_saved), (0, 0));
    assert!(p.send("exit"));
    p.wait(ANSWER);
    drop(coordinator);
    assert_eq!(cg.oom_kills().unwrap_or(0), 0);
    cgroup::remove(child);
}

/// On cgroup v2 a step takes what volatile memory cannot give from the kernel's page cache
/// (`memory.reclaim`): a cgroup holding only a file's clean pages, and no participant, is
/// brought down by the mode, which counts those bytes as saved. v1 has no `memory.reclaim`
/// (listed as lacking).
#[test]
fn on_cgroup_v2_a_step_takes_page_cache_through_memory_reclaim() {
    let _s = serial();
    const FILE: u64 = 64 << 20;
    let Some(child) = cgroup::child_high("vrange-proactive-reclaim-", LIMIT, LIMIT) else {
        return;
    };
    let cg = child.cgroup().clone();
    let dir = socket_dir("proactive-reclaim");
    let socket = dir.join("coordinator.sock");
    // The file's pages are charged to the cgroup of the process that writes them: `dd`, in it.
    let file = dir.join("cached");
    let mut dd = std::process::Command::new("dd");
    dd.arg("if=/dev/zero")
        .arg(format!("of={}", file.display()))
        .args([
            "bs=1M",
            &format!("count={}", FILE >> 20),
            "conv=fsync",
            "status=none",
        ]);
    vrange_sys::cgroup::join_before_exec(&mut dd, &cg.file("cgroup.procs")).expect("join");
    assert!(dd.status().expect("dd").success(), "dd wrote the file");
    let cached = || {
        let stat = std::fs::read_to_string(cg.file("memory.stat")).expect("memory.stat");
        stat.lines()
            .find_map(|l| l.strip_prefix("file ")?.parse::<u64>().ok())
            .expect("file in memory.stat")
    };
    let before = cached();
    assert!(
        before >= FILE / 2,
        "the file is cached: {} MiB",
        before >> 20
    );
    let coordinator = InProcess::start(vrange_coordinator::Options {
        proactive: Some(Proactive {
            min_idle: AGE,
            interval: Duration::from_millis(100),
            stall_pct: 100.0,
            step_pct: 10.0,
        }),
        ..options(&socket, cg.path())
    });
    let deadline = Instant::now() + ANSWER;
    let status = loop {
        // The socket comes with the coordinator's first tick.
        let status = vrange_coordinator::query(&socket).map(|(s, _)| s);
        if let Ok(s) = status.as_ref() {
            if cached() <= before / 2 && s.proactive_saved >= before / 4 {
                break *s;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the page cache stays: {} MiB of {} MiB, {status:?}",
            cached() >> 20,
            before >> 20
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    println!(
        "page cache {} MiB -> {} MiB, saved {} MiB",
        before >> 20,
        cached() >> 20,
        status.proactive_saved >> 20
    );
    drop(coordinator);
    drop(dir);
    cgroup::remove(child);
}

#[test]
fn without_the_mode_cold_volatile_memory_stays_until_pressure() {
    if participant_role() {
        return;
    }
    let _s = serial();
    let test = "without_the_mode_cold_volatile_memory_stays_until_pressure";
    let Some((child, cg, _dir, socket)) = place("off") else {
        return;
    };
    let coordinator = InProcess::start(options(&socket, cg.path()));
    let (mut p, _, _) = old_and_young(test, &cg, &socket.display().to_string());
    await_participants(&socket, 1, ANSWER).expect("the participant connects");
    // As long as the mode would have taken to purge them (its interval, many times over).
    std::thread::sleep(Duration::from_secs(3));
    let r = command(&mut p, "report", "REPORT");
    assert_eq!(
        purged_bits(&r),
        [false; OLD + YOUNG],
        "nothing goes without pressure"
    );
    let (status, _) = vrange_coordinator::query(&socket).expect("query");
    assert_eq!((status.proactive, status.proactive_saved), (0, 0));
    assert!(!coordinator
        .shared
        .metrics()
        .contains("vrange_proactive_saved_bytes_total"));
    assert!(p.send("exit"));
    p.wait(ANSWER);
    drop(coordinator);
    cgroup::remove(child);
}
