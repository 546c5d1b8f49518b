//! One purge order for the container. Four participants in one memory cgroup hold volatile
//! chunks of staggered ages (A's oldest older than B's oldest, and so on); a hog grows in the
//! same cgroup. With the coordinator the chunks purged are the oldest of the container: every
//! purged chunk is older than every kept one. Without it each process purges its own oldest
//! when it sees the pressure, in no order across processes (the run prints how many purged
//! chunks were younger than the oldest kept). No OOM kill either way.

mod common;

use common::*;
use std::time::Duration;
use vrange_testkit::role::{role, Role};
use vrange_testkit::{cgroup, serial, skip};

const LIMIT: u64 = 224 << 20;
/// Chunks per participant; marked A0..A7, then B0..B7, and so on, 100 ms apart.
const CHUNKS: usize = 8;
const NAMES: [&str; 4] = ["A", "B", "C", "D"];
const HOG_MIB: usize = 96;

/// The coordinator's options for these tests: the shared ones, with a request timeout long
/// enough for a slow machine. Every participant here answers; one whose answer merely comes
/// late (a busy or emulated machine that leaves its reclaimer unscheduled for half a second)
/// would be marked unresponsive and left out of the plan, and the next-oldest data would go
/// in its place: right for a hung process, but not the order these tests assert.
fn patient(socket: &std::path::Path, cg: &std::path::Path) -> vrange_coordinator::Options {
    vrange_coordinator::Options {
        request_timeout: Duration::from_secs(5),
        ..options(socket, cg)
    }
}

/// A coordinator of `cg` on `socket` with the headroom threshold and the ping interval
/// `vrange daemon` uses by default (a sixteenth of the ceiling; 250 ms), and the environment
/// that makes a participant use it. The ping sets how long a room request counts a participant
/// busy with an older request before taking the room from the others (two pings): under
/// emulation on a loaded machine, a participant purging 15 chunks took longer than the tests'
/// 100 ms ping allows (the 6.1 guest of a busy CI run).
fn as_the_daemon_runs(
    socket: &std::path::Path,
    cg: &std::path::Path,
) -> (InProcess, [(&'static str, String); 1]) {
    let coordinator = InProcess::start(vrange_coordinator::Options {
        headroom: None,
        ping: vrange_coordinator::Options::default().ping,
        ..patient(socket, cg)
    });
    (
        coordinator,
        [("VRANGE_COORDINATOR", socket.display().to_string())],
    )
}

fn roles() -> bool {
    match role().as_deref() {
        Some("participant") => participant(),
        Some("hog") => hog(),
        Some(_) => panic!("unknown role"),
        None => return false,
    }
    true
}

/// What happened to each chunk, in marking order: (participant, chunk, purged).
struct Outcome {
    chunks: Vec<(usize, usize, bool)>,
    kills: u64,
    reports: Vec<vrange_testkit::role::Reply>,
}

impl Outcome {
    /// From the participants' reports, the oldest participant's first: when each marked all
    /// its chunks before the next one started, their chunks in marking order.
    fn in_turn(reports: Vec<vrange_testkit::role::Reply>, kills: u64) -> Outcome {
        let chunks = reports
            .iter()
            .enumerate()
            .flat_map(|(p, r)| {
                purged_bits(r)
                    .into_iter()
                    .enumerate()
                    .map(move |(i, purged)| (p, i, purged))
            })
            .collect();
        Outcome {
            chunks,
            kills,
            reports,
        }
    }
}

/// Runs the scenario; participant p holds its chunks as page ranges of one shared region if
/// `shared[p]`, else as private regions.
fn scenario(test: &str, coordinated: bool, shared: [bool; 4]) -> Option<Outcome> {
    let child = match cgroup::child("vrange-coord-", LIMIT) {
        Ok(c) => c,
        Err(why) => {
            skip(why);
            return None;
        }
    };
    let cg = child.cgroup().clone();
    let dir = socket_dir(if coordinated { "on" } else { "off" });
    let socket = dir.join("coordinator.sock");
    let coordinator = coordinated.then(|| InProcess::start(patient(&socket, cg.path())));
    let setting = if coordinated {
        socket.display().to_string()
    } else {
        "off".to_string()
    };
    let mut ps: Vec<Role> = NAMES
        .iter()
        .map(|_| {
            spawn(
                test,
                "participant",
                &cg,
                &[("VRANGE_COORDINATOR", setting.clone())],
            )
        })
        .collect();
    let mut order = Vec::new();
    for (p, role) in ps.iter_mut().enumerate() {
        let (cmd, tag) = if shared[p] {
            ("range", "RANGED")
        } else {
            ("mark", "MARKED")
        };
        for i in 0..CHUNKS {
            assert!(role.send(cmd));
            let r = role.next(ANSWER).expect(tag);
            assert_eq!(r.tag, tag);
            order.push((p, i));
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    if coordinated {
        let ranged = shared.iter().filter(|&&s| s).count();
        let private = (NAMES.len() - ranged) as u64;
        await_with_data(&socket, NAMES.len() as u64, private, ANSWER)
            .expect("participants connect");
        await_shared(&socket, ranged, ANSWER).expect("the shared regions reach the coordinator");
    } else {
        // Give each reclaimer its sources (a tick after the first volatile byte).
        std::thread::sleep(Duration::from_millis(500));
    }
    let mut hog = spawn(
        test,
        "hog",
        &cg,
        &[
            ("VRT_HOG_MIB", HOG_MIB.to_string()),
            ("VRT_HOG_STEP_MS", "20".to_string()),
        ],
    );
    let hogged = hog.next(Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(500));
    let mut reports = Vec::new();
    for role in ps.iter_mut() {
        assert!(role.send("report"));
        reports.push(role.next(ANSWER).expect("REPORT"));
    }
    let kills = cg.oom_kills().expect("OOM kill count");
    drop(hog);
    drop(ps);
    drop(coordinator);
    let _ = std::fs::remove_dir_all(&dir);
    cgroup::remove(child);
    assert!(hogged.is_ok(), "the hog finished: {hogged:?}");
    let bits: Vec<Vec<bool>> = reports
        .iter()
        .zip(shared)
        .map(|(r, shared)| bits(r, if shared { "ranges" } else { "purged" }))
        .collect();
    let chunks = order.iter().map(|&(p, i)| (p, i, bits[p][i])).collect();
    Some(Outcome {
        chunks,
        kills,
        reports,
    })
}

fn show(o: &Outcome) -> String {
    let mut s = String::from("purged in marking order (oldest first): ");
    for &(p, i, purged) in &o.chunks {
        s += &format!("{}{}{} ", NAMES[p], i, if purged { "x" } else { "" });
    }
    s
}

/// Purged chunks younger than the oldest kept one: 0 when the purge followed one global order.
fn inversions(o: &Outcome) -> usize {
    let Some(first_kept) = o.chunks.iter().position(|c| !c.2) else {
        return 0;
    };
    o.chunks[first_kept..].iter().filter(|c| c.2).count()
}

/// What a coordinated run must show: no OOM kill, some chunks purged and not all, the purged
/// chunks a prefix of the marking order (the youngest process loses data only after every
/// older chunk of every process is gone), pinned data intact, every participant connected.
fn in_one_order(o: &Outcome) {
    println!("{}", show(o));
    assert_eq!(o.kills, 0, "no OOM kill");
    let purged = o.chunks.iter().filter(|c| c.2).count();
    assert!(purged >= 4, "pressure purged something: {}", show(o));
    assert!(purged < o.chunks.len(), "not everything: {}", show(o));
    assert_eq!(
        inversions(o),
        0,
        "one global order: {}\nreports: {:?}",
        show(o),
        o.reports
    );
    for r in &o.reports {
        assert_eq!(r.u64("pinned_ok"), 1);
        assert!(r.u64("connections") >= 1, "{r:?}");
    }
}

#[test]
fn the_coordinator_purges_the_oldest_of_the_container_first() {
    if roles() {
        return;
    }
    let _s = serial();
    let Some(o) = scenario(
        "the_coordinator_purges_the_oldest_of_the_container_first",
        true,
        [false; 4],
    ) else {
        return;
    };
    in_one_order(&o);
    let obeyed: u64 = o.reports.iter().map(|r| r.u64("requests")).sum();
    assert!(obeyed >= 1, "purges came as requests: {:?}", o.reports);
}

/// The same with A's and C's chunks as page ranges of a shared region each (marked one range
/// at a time, so each range has its own age): the coordinator counts the ranges of the
/// regions passed to it, orders them with the private chunks, and purges them itself. The
/// purged chunks are still a prefix of the one order, shared ranges and private chunks alike.
#[test]
fn the_coordinator_purges_shared_ranges_in_the_global_order() {
    if roles() {
        return;
    }
    let _s = serial();
    let Some(o) = scenario(
        "the_coordinator_purges_shared_ranges_in_the_global_order",
        true,
        [true, false, true, false],
    ) else {
        return;
    };
    in_one_order(&o);
    assert!(
        o.chunks.iter().any(|c| c.0 == 0 && c.2),
        "A's shared ranges, the oldest, went first: {}",
        show(&o)
    );
}

#[test]
fn without_the_coordinator_each_process_purges_its_own_oldest() {
    if roles() {
        return;
    }
    let _s = serial();
    let Some(o) = scenario(
        "without_the_coordinator_each_process_purges_its_own_oldest",
        false,
        [false; 4],
    ) else {
        return;
    };
    println!("{}", show(&o));
    assert_eq!(o.kills, 0, "no OOM kill");
    for r in &o.reports {
        assert_eq!(r.u64("connections"), 0);
        assert_eq!(r.u64("requests"), 0);
    }
    // Each process purged its own oldest first: per process, the purged chunks are a prefix of
    // its own marking order; across processes there is no order (whoever saw the pressure
    // first purged), which the coordinator exists to fix.
    for (p, name) in NAMES.iter().enumerate() {
        let mine: Vec<bool> = o.chunks.iter().filter(|c| c.0 == p).map(|c| c.2).collect();
        let kept = mine.iter().position(|purged| !purged).unwrap_or(mine.len());
        assert!(
            mine[kept..].iter().all(|purged| !purged),
            "{name} purged its own oldest first: {}",
            show(&o)
        );
    }
    assert!(o.chunks.iter().any(|c| c.2), "pressure purged something");
    println!(
        "purged chunks younger than the oldest kept one: {} (0 with the coordinator)",
        inversions(&o)
    );
}

/// The cache's own guard (`make_room` before it maps a slab) went around the global order: on
/// a 256 MiB cgroup with an old process holding 100 MiB and a young one filling 140 MiB fast,
/// the young one purged its own data each time its guard saw the headroom short, the old one
/// lost nothing and the coordinator started no round. While a coordinator is live,
/// `make_room` asks it for the room: the old process's data goes first.
#[test]
fn make_room_of_a_young_filler_follows_the_global_order() {
    const TEST: &str = "make_room_of_a_young_filler_follows_the_global_order";
    const OLD_CHUNKS: usize = 25;
    const FILL_CHUNKS: usize = 35;
    if roles() {
        return;
    }
    let _s = serial();
    let child = match cgroup::child("vrange-coord-room-", 256 << 20) {
        Ok(c) => c,
        Err(why) => return skip(why),
    };
    let cg = child.cgroup().clone();
    let dir = socket_dir("room");
    let socket = dir.join("coordinator.sock");
    // The coordinator's threshold is the participants' own (the limit / 16), so the filler's
    // guard sees the headroom short before the coordinator.
    let (coordinator, env) = as_the_daemon_runs(&socket, cg.path());
    let mut old = spawn(TEST, "participant", &cg, &env);
    for _ in 0..OLD_CHUNKS {
        assert!(old.send("mark"));
        old.expect("MARKED", ANSWER);
    }
    await_participants(&socket, 1, ANSWER).expect("the old one connects");
    std::thread::sleep(Duration::from_secs(2));
    let mut young = spawn(TEST, "participant", &cg, &env);
    assert!(young.send("mark"));
    young.expect("MARKED", ANSWER);
    await_participants(&socket, 2, ANSWER).expect("the young one connects");
    // Two threads, as a cache's inserts come from several: while one waits for the round,
    // the other must not map past the limit.
    assert!(young.send(&format!("fill {FILL_CHUNKS} 2")));
    let filled = young.expect("FILLED", Duration::from_secs(60));
    let mut reports = Vec::new();
    for p in [&mut old, &mut young] {
        assert!(p.send("report"));
        reports.push(p.expect("REPORT", ANSWER));
    }
    let kills = cg.oom_kills().expect("OOM kill count");
    let rounds = vrange_coordinator::query(&socket).map(|(s, _)| s.rounds);
    drop((old, young));
    drop(coordinator);
    drop(dir);
    cgroup::remove(child);
    // Marking order: the old one's chunks, then the young one's.
    let o = Outcome::in_turn(reports, kills);
    let show = || {
        let mut s = String::from("purged in marking order (oldest first): ");
        for &(p, i, purged) in &o.chunks {
            s += &format!(
                "{}{}{} ",
                ["old", "young"][p],
                i,
                if purged { "x" } else { "" }
            );
        }
        format!(
            "{s}\nfilled: {filled:?}\nrounds: {rounds:?}\nreports: {:?}",
            o.reports
        )
    };
    println!("{}", show());
    assert_eq!(o.kills, 0, "no OOM kill");
    assert!(
        o.chunks.iter().any(|c| c.0 == 0 && c.2),
        "the old one's data went first: {}",
        show()
    );
    assert_eq!(inversions(&o), 0, "one global order: {}", show());
    assert_eq!(
        o.reports[1].u64("own_bytes"),
        0,
        "the young one purged nothing on its own: {}",
        show()
    );
    assert!(o.reports[0].u64("requests") >= 1, "{}", show());
}

/// The coordinator's rounds, and the bytes `pid` has freed for it (by request or from its
/// shared regions directly), once that is more than nothing or `timeout` has passed.
fn answered(socket: &std::path::Path, pid: u32, timeout: Duration) -> (Option<u64>, u64) {
    let t = std::time::Instant::now();
    loop {
        let status = vrange_coordinator::query(socket);
        let rounds = status.as_ref().ok().map(|(s, _)| s.rounds);
        let freed = status.as_ref().map_or(0, |(_, rows)| {
            rows.iter().find(|r| r.pid == pid).map_or(0, |r| r.freed)
        });
        if freed > 0 || t.elapsed() >= timeout {
            return (rounds, freed);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// cgroup v2: a container held by `memory.high` alone, its hard limit far above. The
/// coordinator takes the same ceiling as its participants (the lower of `memory.max` and
/// `memory.high`): as the group nears the threshold it purges the container's oldest data,
/// the old process's, and the group gets back under the threshold. cgroup v1 has no
/// `memory.high`: skipped there as the feature probe finds the memory controller on v1
/// (`.ci/guest-tests 6.12` runs it on v2).
#[test]
fn a_coordinated_v2_group_is_kept_under_memory_high_in_the_global_order() {
    const TEST: &str = "a_coordinated_v2_group_is_kept_under_memory_high_in_the_global_order";
    const HIGH: u64 = 128 << 20;
    const CHUNKS: usize = 16;
    if roles() {
        return;
    }
    let _s = serial();
    let Some(child) = cgroup::child_high("vrange-coord-high-", HIGH, 1 << 30) else {
        return;
    };
    let cg = child.cgroup().clone();
    let dir = socket_dir("high");
    let socket = dir.join("coordinator.sock");
    let (coordinator, env) = as_the_daemon_runs(&socket, cg.path());
    let mut ps = Vec::new();
    for n in 1..=2 {
        let mut p = spawn(TEST, "participant", &cg, &env);
        for _ in 0..CHUNKS {
            assert!(p.send("mark"));
            p.expect("MARKED", Duration::from_secs(20));
        }
        // Connected; the first one's data may be gone by now.
        await_connected(&socket, n, ANSWER).expect("connected");
        ps.push(p);
    }
    let t = std::time::Instant::now();
    let mut usage = cg.usage().expect("usage");
    while usage > HIGH && t.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(50));
        usage = cg.usage().expect("usage");
    }
    // The group is under the threshold as soon as the purge's pages are freed, before the
    // old participant has finished the purge and answered (the range reads as purged while
    // it is PURGING, its counts come after): wait for the answer before asking for reports.
    let old_pid = u32::try_from(ps[0].pid()).unwrap_or(0);
    let (rounds, freed_for_coordinator) = answered(&socket, old_pid, ANSWER);
    let reports: Vec<_> = ps
        .iter_mut()
        .map(|p| {
            assert!(p.send("report"));
            p.expect("REPORT", ANSWER)
        })
        .collect();
    let kills = cg.oom_kills().expect("OOM kill count");
    drop(ps);
    drop(coordinator);
    drop(dir);
    cgroup::remove(child);
    let o = Outcome::in_turn(reports, kills);
    let line = format!(
        "usage {} MiB (memory.high {} MiB), rounds {rounds:?}, freed for the coordinator by \
         the old one {freed_for_coordinator}: {}\nreports: {:?}",
        usage >> 20,
        HIGH >> 20,
        show(&o),
        o.reports
    );
    println!("{line}");
    assert_eq!(o.kills, 0, "{line}");
    assert!(usage <= HIGH, "still over memory.high: {line}");
    assert!(o.chunks[0].2, "the oldest chunk went first: {line}");
    assert!(
        !o.chunks[o.chunks.len() - 1].2,
        "the youngest stayed: {line}"
    );
    assert_eq!(inversions(&o), 0, "one global order: {line}");
    for r in &o.reports {
        assert_eq!(r.u64("pinned_ok"), 1, "{line}");
        assert_eq!(r.u64("own_bytes"), 0, "purged only on request: {line}");
    }
    assert!(
        o.reports[0].u64("requests") >= 1 || freed_for_coordinator > 0,
        "the old participant's data went at the coordinator's hand: {line}"
    );
}
