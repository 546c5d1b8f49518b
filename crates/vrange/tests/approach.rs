//! Volatile memory the kernel can take before the limit: a neighbour that writes at memory
//! speed right after a process marks memory volatile (default policy, default settings) must
//! not be OOM-killed while that memory is still resident.
//!
//! Regression test: only ranges volatile for the arm delay (1 s) could be taken by the kernel,
//! and the reclaimer opens its pressure sources a tick (100 ms) after the first mark. A burst
//! within 100 ms of the first mark found 13 MiB of volatile memory resident in a 48 MiB cgroup
//! and the neighbour was OOM-killed, 30 times out of 30. Arming on approach
//! (`reclaim/approach.rs`) hands the range to the kernel's lazy-free path at the mark when the
//! cgroup is closer to its limit than a tick of faulting.
//!
//! # Design
//! The test process creates a child cgroup of `LIMIT` bytes and spawns two re-executions of this
//! binary in it (`vrange_testkit::role`): the *burster*, which waits, and the *holder*, which
//! creates a `VOLATILE` region with default options, fills it with a pattern, marks it and says
//! so at once. `DELAY` after that, the test tells the burster to touch what fits under the
//! limit plus `MUST_FREE` at full speed, in 4 KiB pages. It survives only if the kernel takes
//! at least `MUST_FREE` of the volatile region (nothing else can be reclaimed: no swap). The
//! holder then unmarks and checks that every page is its pattern or zero, as reported.
//!
//! A hot range (marked again within 50 ms of its previous mark) is the exception:
//! `a_hot_range_is_armed_once_idle_not_at_every_mark` checks, in a cgroup as tight, that
//! marks in a quick loop are not armed one by one, that the range is armed once left idle,
//! and that its content comes back exact. And only the reserve is armed:
//! `only_the_coldest_reserve_is_armed` checks that once the kernel can take what a burst would
//! charge beyond the headroom, a range marked later stays managed.

use std::time::{Duration, Instant};
use vrange::{Options, VolatileRegion};
use vrange_sys::cgroup::join_before_exec;
use vrange_testkit::cgroup;
use vrange_testkit::hog;
use vrange_testkit::pattern::{check_at, fill, is_zero};
use vrange_testkit::role::{command, role, role_command, say, Role};
use vrange_testkit::serial;

const MIB: usize = 1 << 20;
const LIMIT: usize = 48 * MIB;
const VOLATILE: usize = 13 * MIB;
const MUST_FREE: usize = 6 * MIB;
const SEED: u64 = 77;
const SYNC: Duration = Duration::from_secs(20);
const TEST: &str = "a_burst_right_after_the_first_mark_finds_the_memory_takeable";
const TRIALS: usize = 3;
const HOT_TEST: &str = "a_hot_range_is_armed_once_idle_not_at_every_mark";
/// The hot range, and the mark/unmark cycles of one batch.
const HOT_LEN: usize = 2 * MIB;
/// Regions of `HOT_LEN` marked for the first time in the tight cgroup (the last is the hot one).
const FRESH: usize = 4;
const CYCLES: u64 = 500;
/// Marks 12 ms apart (over a tight tick, under the hot window).
const PACED: u64 = 20;
const RESERVE_TEST: &str = "only_the_coldest_reserve_is_armed";
/// A cgroup whose headroom, with both regions resident, is under the smallest burst (64 MiB)
/// by less than the older region: the reserve needs that one, not the younger.
const RESERVE_LIMIT: usize = 112 * MIB;
const OLD_LEN: usize = 48 * MIB;
const YOUNG_LEN: usize = 8 * MIB;

fn holder() {
    let r = VolatileRegion::new(VOLATILE, Options::default()).expect("region");
    fill(r.as_ptr(), r.len(), SEED);
    // SAFETY: nothing refers into the region until it is unmarked below.
    unsafe { r.mark() }.expect("mark");
    say("MARKED");
    assert_eq!(command().as_deref(), Some("check"));
    let u = r.unmark().expect("unmark");
    let page = vrange::page_size();
    let (mut zero, mut intact, mut bad) = (0, 0, 0);
    for off in (0..r.len()).step_by(page) {
        // SAFETY: inside the region, pinned again.
        let p = unsafe { r.as_ptr().add(off) };
        if is_zero(p, page) {
            zero += 1;
        } else if check_at(r.as_ptr(), off, page, SEED) {
            intact += 1;
        } else {
            bad += 1;
        }
    }
    let armed = vrange::stats().armed_total_bytes;
    say(format_args!(
        "VERDICT purged={} zero={zero} intact={intact} bad={bad} armed={armed}",
        u.purged
    ));
}

fn burster() {
    hog::prefer_oom_kill().expect("oom_score_adj");
    let go = command().expect("go");
    let bytes: usize = go
        .strip_prefix("go ")
        .and_then(|b| b.parse().ok())
        .expect("go BYTES");
    let t = Instant::now();
    hog::touch(bytes, bytes, Duration::ZERO).expect("map");
    say(format_args!(
        "DONE bytes={bytes} us={}",
        t.elapsed().as_micros()
    ));
}

/// One trial; returns a line describing it, or panics with the reason it failed.
fn trial(delay: Duration) -> Option<String> {
    let child = match cgroup::child("vrange-approach-", LIMIT as u64) {
        Ok(c) => c,
        Err(why) => {
            vrange_testkit::skip(why);
            return None;
        }
    };
    let cg = child.cgroup().clone();
    let procs = cg.file("cgroup.procs");
    let mut cmd = role_command(TEST, "burster");
    join_before_exec(&mut cmd, &procs).expect("join");
    let mut burster = Role::spawn("burster", cmd);
    let mut cmd = role_command(TEST, "holder");
    join_before_exec(&mut cmd, &procs).expect("join");
    let mut holder = Role::spawn("holder", cmd);
    holder.expect("MARKED", SYNC);
    let marked = Instant::now();
    let usage = cg.usage().expect("usage") as usize;
    let bytes = (LIMIT + MUST_FREE)
        .saturating_sub(usage)
        .next_multiple_of(MIB);
    std::thread::sleep(delay.saturating_sub(marked.elapsed()));
    let late = marked.elapsed();
    assert!(burster.send(&format!("go {bytes}")), "burster gone");
    let done = burster.next(SYNC);
    let burster_exit = burster.wait(SYNC);
    let kills = cg.oom_kills().expect("oom kills");
    assert!(
        holder.send("check"),
        "holder gone: {}",
        holder.diagnostics()
    );
    let verdict = holder.expect("VERDICT", SYNC);
    holder.close_stdin();
    let holder_exit = holder.wait(SYNC);
    drop((holder, burster));
    cgroup::remove(child);
    let line = format!(
        "burst {} ms after the mark: {bytes} bytes with {usage} charged, {done:?}, burster \
         {burster_exit}, holder {holder_exit}, {kills} OOM kills; {verdict:?}",
        late.as_millis()
    );
    assert_eq!(kills, 0, "{line}");
    assert!(done.is_ok(), "{line}");
    let pages = VOLATILE / vrange::page_size();
    assert_eq!(verdict.u64("bad"), 0, "{line}");
    assert_eq!(verdict.u64("zero") + verdict.u64("intact"), pages as u64);
    assert_eq!(verdict.u64("purged"), verdict.u64("zero"), "exact: {line}");
    assert!(
        verdict.u64("purged") as usize * vrange::page_size() >= MUST_FREE / 2,
        "the burst fit without taking the volatile memory: {line}"
    );
    Some(line)
}

#[test]
fn a_burst_right_after_the_first_mark_finds_the_memory_takeable() {
    match role().as_deref() {
        Some("holder") => return holder(),
        Some("burster") => return burster(),
        Some("hot") | Some("reserve") => return,
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let _serial = serial();
    for delay in [0, 50, 100] {
        for _ in 0..TRIALS {
            match trial(Duration::from_millis(delay)) {
                Some(line) => println!("{line}"),
                None => return,
            }
        }
    }
}

/// In the tight cgroup: first marks armed at once, then batches of `CYCLES` quick
/// mark/unmark cycles until one arms fewer than a tenth of its marks (the reclaimer has
/// measured the headroom: before that, every mark arms), then the range left marked until the
/// reclaimer arms it, then unmarked and checked page by page.
fn hot_holder() {
    let armed = || vrange::stats().armed_total_bytes;
    // First marks of FRESH regions (the hot one last), each counted armed at once if its own
    // mark armed it. A reclaimer tick can arm a range between its mark and the mark's look at
    // the deficit (or hold the purge lock as it marks): that range is the tick's to arm, so
    // one first mark in FRESH may miss "at once"; all are armed within a tick or two.
    let start = armed();
    let mut at_once = 0;
    let mut fresh = Vec::new();
    for _ in 0..FRESH {
        let r = VolatileRegion::new(HOT_LEN, Options::default()).expect("region");
        fill(r.as_ptr(), r.len(), SEED);
        let before = armed();
        // SAFETY: nothing refers into the region while it is volatile.
        unsafe { r.mark() }.expect("mark");
        at_once += u64::from(armed() - before >= HOT_LEN as u64);
        fresh.push(r);
    }
    let deadline = Instant::now() + SYNC;
    while armed() - start < (FRESH * HOT_LEN) as u64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    let fresh_armed = armed() - start;
    let r = fresh.pop().expect("the hot region");
    drop(fresh);
    let mut batches = Vec::new();
    let deadline = Instant::now() + SYNC;
    loop {
        let before = armed();
        for _ in 0..CYCLES {
            let u = r.unmark().expect("unmark");
            assert_eq!(
                u.purged, 0,
                "nothing presses this cgroup: nothing may be lost"
            );
            // SAFETY: as above.
            unsafe { r.mark() }.expect("mark");
        }
        let arms = (armed() - before) / HOT_LEN as u64;
        batches.push(arms);
        if arms < CYCLES / 10 || Instant::now() > deadline {
            break;
        }
    }
    // Marked at a tick's pace (as a cache's flush marks a slab hit between ticks): still hot.
    let before = armed();
    for _ in 0..PACED {
        r.unmark().expect("unmark");
        std::thread::sleep(Duration::from_millis(12));
        // SAFETY: as above.
        unsafe { r.mark() }.expect("mark");
    }
    let paced = (armed() - before) / HOT_LEN as u64;
    // Left alone: armed by the reclaimer once idle for a tick.
    let idle = Instant::now();
    while vrange::stats().armed_bytes < HOT_LEN as u64 && idle.elapsed() < SYNC {
        std::thread::sleep(Duration::from_millis(5));
    }
    let armed_idle = vrange::stats().armed_bytes;
    let waited = idle.elapsed().as_millis();
    let u = r.unmark().expect("unmark");
    let page = vrange::page_size();
    let (mut zero, mut bad) = (0, 0);
    for off in (0..r.len()).step_by(page) {
        // SAFETY: inside the region, pinned again.
        let p = unsafe { r.as_ptr().add(off) };
        if is_zero(p, page) {
            zero += 1;
        } else if !check_at(r.as_ptr(), off, page, SEED) {
            bad += 1;
        }
    }
    let batches: Vec<String> = batches.iter().map(u64::to_string).collect();
    say(format_args!(
        "HOT at_once={at_once} fresh_armed={fresh_armed} batches={} paced={paced} \
         armed_idle={armed_idle} waited_ms={waited} \
         purged={} \
         zero={zero} bad={bad}",
        batches.join(","),
        u.purged
    ));
}

#[test]
fn a_hot_range_is_armed_once_idle_not_at_every_mark() {
    if role().as_deref() == Some("hot") {
        return hot_holder();
    }
    let _serial = serial();
    // Tight: the cgroup's headroom is below the smallest watermark (64 MiB) from the start.
    let child = match cgroup::child("vrange-hot-", LIMIT as u64) {
        Ok(c) => c,
        Err(why) => return vrange_testkit::skip(why),
    };
    let mut cmd = role_command(HOT_TEST, "hot");
    join_before_exec(&mut cmd, &child.cgroup().file("cgroup.procs")).expect("join");
    let mut holder = Role::spawn("hot", cmd);
    let line = holder.expect("HOT", SYNC * 2);
    let exit = holder.wait(SYNC);
    drop(holder);
    cgroup::remove(child);
    println!("{line:?}, {exit}");
    assert!(
        line.u64("at_once") >= FRESH as u64 - 1,
        "first marks while tight arm at once: {line:?}"
    );
    assert_eq!(
        line.u64("fresh_armed"),
        (FRESH * HOT_LEN) as u64,
        "every range marked for the first time while tight is armed: {line:?}"
    );
    let last: u64 = line
        .str("batches")
        .rsplit(',')
        .next()
        .and_then(|b| b.parse().ok())
        .expect("batches");
    assert!(
        last < CYCLES / 10,
        "every batch of {CYCLES} hot marks armed a tenth of them or more: {line:?}"
    );
    assert!(
        line.u64("paced") < PACED / 2,
        "marks a tick apart armed half the time or more: {line:?}"
    );
    assert_eq!(
        line.u64("armed_idle"),
        HOT_LEN as u64,
        "left idle, the hot range is armed: {line:?}"
    );
    assert_eq!(line.u64("bad"), 0, "{line:?}");
    assert_eq!(line.u64("purged"), line.u64("zero"), "exact: {line:?}");
}

/// Sleeps `d`, and returns the largest armed reserve the reclaimer kept meanwhile (read every
/// 2 ms: its ticks are at least 10 ms apart).
fn largest_reserve(d: Duration) -> u64 {
    let t = Instant::now();
    let mut most = 0;
    while t.elapsed() < d {
        most = most.max(vrange::stats().reserve_bytes);
        std::thread::sleep(Duration::from_millis(2));
    }
    most
}

/// In the reserve's cgroup: two regions filled; once the reclaimer has measured (tight), the
/// old one is marked, a few ticks later the young one; a few ticks after that, what is armed,
/// and the largest reserve the reclaimer kept since the young one's mark.
fn reserve_holder() {
    let old = VolatileRegion::new(OLD_LEN, Options::default()).expect("region");
    let young = VolatileRegion::new(YOUNG_LEN, Options::default()).expect("region");
    fill(old.as_ptr(), old.len(), SEED);
    fill(young.as_ptr(), young.len(), SEED + 1);
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: nothing refers into the regions while they are volatile.
    unsafe { old.mark() }.expect("mark");
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: as above.
    unsafe { young.mark() }.expect("mark");
    let reserve = largest_reserve(Duration::from_millis(200));
    let armed = vrange::stats().armed_bytes;
    let (mut bad, mut lost) = (0, 0);
    for (r, seed) in [(&old, SEED), (&young, SEED + 1)] {
        let u = r.unmark().expect("unmark");
        lost += u.purged;
        let page = vrange::page_size();
        for off in (0..r.len()).step_by(page) {
            // SAFETY: inside the region, pinned again.
            let p = unsafe { r.as_ptr().add(off) };
            if !is_zero(p, page) && !check_at(r.as_ptr(), off, page, seed) {
                bad += 1;
            }
        }
    }
    say(format_args!(
        "RESERVE armed={armed} reserve={reserve} bad={bad} lost={lost}"
    ));
}

#[test]
fn only_the_coldest_reserve_is_armed() {
    if role().as_deref() == Some("reserve") {
        return reserve_holder();
    }
    let _serial = serial();
    let child = match cgroup::child("vrange-reserve-", RESERVE_LIMIT as u64) {
        Ok(c) => c,
        Err(why) => return vrange_testkit::skip(why),
    };
    let mut cmd = role_command(RESERVE_TEST, "reserve");
    join_before_exec(&mut cmd, &child.cgroup().file("cgroup.procs")).expect("join");
    let mut holder = Role::spawn("reserve", cmd);
    let line = holder.expect("RESERVE", SYNC);
    let exit = holder.wait(SYNC);
    drop(holder);
    cgroup::remove(child);
    println!("{line:?}, {exit}");
    let (armed, reserve) = (line.u64("armed"), line.u64("reserve"));
    assert!(
        reserve > 0,
        "tight: the reclaimer keeps a reserve: {line:?}"
    );
    if reserve <= OLD_LEN as u64 {
        assert_eq!(
            armed, OLD_LEN as u64,
            "the old region covers the reserve; the young one stays managed: {line:?}"
        );
    } else {
        // A busy machine: the reclaimer's ticks came late, and what a neighbour could charge
        // until it looks again grew past the old region at some tick after the young one's
        // mark: the young one is armed then.
        assert!(
            armed >= OLD_LEN as u64,
            "the old region is armed first: {line:?}"
        );
    }
    assert_eq!(line.u64("bad"), 0, "{line:?}");
    assert_eq!(line.u64("lost"), 0, "nothing pressed the cgroup: {line:?}");
}
