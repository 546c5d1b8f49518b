//! cgroup v2's `memory.high`: a container held by a throttling threshold, not a hard limit.
//!
//! Above `memory.high` the kernel reclaims and then throttles the group's allocating tasks; it
//! never OOM-kills there, but without swap it can take nothing from a process's managed
//! volatile memory, so the group would stay over the threshold, throttled, for as long as that
//! memory is held. vrange counts `memory.high` as the group's ceiling (the headroom is the
//! lower of `memory.max` and `memory.high` minus `memory.current`): its reclaimer purges the
//! oldest volatile ranges before the group reaches the threshold.
//!
//! # Design
//! The test makes a child cgroup with `memory.high` at `HIGH` and a hard limit far above it
//! (`MAX`: nothing else would make room), and runs the *holder* in it, a re-execution of this
//! binary with default settings: it keeps `PINNED` bytes pinned and makes `REGIONS` managed
//! regions of `REGION` bytes one after another, each filled with its own pattern and then left
//! volatile, `VOLATILE` bytes in all, more than `HIGH`. The test waits until the group is back
//! under the threshold, then the holder pins everything again and checks each page: its
//! pattern or (purged) zero, as reported. Only the headroom source can have purged: there is
//! no hard limit near, no machine-wide pressure, and the cgroup's PSI trigger counts stalls
//! the throttling would cause only after the fact.
//!
//! cgroup v1 has no `memory.high`: there the test is skipped as the feature probe finds the
//! process's memory controller on v1 (`.ci/guest-tests 6.12` runs it on v2).

use std::time::{Duration, Instant};
use vrange::{Options, Policy, Source, VolatileRegion};
use vrange_sys::cgroup::join_before_exec;
use vrange_testkit::cgroup;
use vrange_testkit::pattern::{check, check_at, fill, is_zero};
use vrange_testkit::role::{command, role, role_command, say, Role};
use vrange_testkit::serial;

const MIB: usize = 1 << 20;
const HIGH: usize = 96 * MIB;
const MAX: usize = 1024 * MIB;
const PINNED: usize = 16 * MIB;
const REGION: usize = 4 * MIB;
const REGIONS: usize = 40;
const VOLATILE: usize = REGION * REGIONS;
const SYNC: Duration = Duration::from_secs(60);
/// How long the group may take to get back under the threshold once the holder is done.
const SETTLE: Duration = Duration::from_secs(20);
const TEST: &str = "a_group_over_memory_high_gets_its_volatile_memory_back";

fn seed(i: usize) -> u64 {
    i as u64 * 31 + 5
}

fn holder() {
    let managed = Options {
        policy: Policy::Managed,
        ..Options::default()
    };
    // A new region is pinned: this one stays so.
    let pinned = VolatileRegion::new(PINNED, managed).expect("pinned region");
    fill(pinned.as_ptr(), PINNED, seed(999));
    let mut regions = Vec::with_capacity(REGIONS);
    for i in 0..REGIONS {
        let mut r = VolatileRegion::new(REGION, managed).expect("region");
        {
            let mut p = r.pin().expect("pin");
            fill(p.as_mut_ptr(), REGION, seed(i));
        }
        regions.push(r);
    }
    say("FILLED");
    assert_eq!(command().as_deref(), Some("check"));
    let page = vrange::page_size();
    let (mut zero, mut intact, mut bad, mut reported) = (0u64, 0u64, 0u64, 0u64);
    for (i, r) in regions.iter().enumerate() {
        let u = r.unmark().expect("unmark");
        reported += u.purged as u64;
        for off in (0..REGION).step_by(page) {
            // SAFETY: inside the region, pinned again by the unmark.
            let p = unsafe { r.as_ptr().add(off) };
            if is_zero(p, page) {
                zero += 1;
            } else if check_at(r.as_ptr(), off, page, seed(i)) {
                intact += 1;
            } else {
                bad += 1;
            }
        }
    }
    let st = vrange::stats();
    let by = |s: Source| st.sources[s as usize].bytes;
    say(format_args!(
        "VERDICT reported={reported} zero={zero} intact={intact} bad={bad} pinned_ok={} \
         headroom_bytes={} psi_bytes={} budget_bytes={} purged_bytes={}",
        u8::from(check(pinned.as_ptr(), PINNED, seed(999))),
        by(Source::Headroom),
        by(Source::Psi) + by(Source::PsiCgroup),
        by(Source::Budget),
        st.purged_total_bytes,
    ));
}

#[test]
fn a_group_over_memory_high_gets_its_volatile_memory_back() {
    match role().as_deref() {
        Some("holder") => return holder(),
        Some(other) => panic!("unknown role {other}"),
        None => {}
    }
    let _serial = serial();
    let Some(child) = cgroup::child_high("vrange-high-", HIGH as u64, MAX as u64) else {
        return;
    };
    let cg = child.cgroup().clone();
    let mut cmd = role_command(TEST, "holder");
    join_before_exec(&mut cmd, &cg.file("cgroup.procs")).expect("join");
    let mut holder = Role::spawn("holder", cmd);
    holder.expect("FILLED", SYNC);
    let t = Instant::now();
    let mut usage = cg.usage().expect("usage");
    while usage > HIGH as u64 && t.elapsed() < SETTLE {
        std::thread::sleep(Duration::from_millis(50));
        usage = cg.usage().expect("usage");
    }
    let settled = t.elapsed();
    let peak = cgroup::peak(&cg);
    let events = cgroup::v2_event(&cg, "high").unwrap_or(0);
    assert!(
        holder.send("check"),
        "holder gone: {}",
        holder.diagnostics()
    );
    let v = holder.expect("VERDICT", SYNC);
    holder.close_stdin();
    let exit = holder.wait(SYNC);
    let kills = cg.oom_kills().expect("oom kills");
    drop(holder);
    cgroup::remove(child);
    let line = format!(
        "usage {} MiB {} ms after the holder was done (memory.high {} MiB), peak {:?} MiB, \
         {events} high events, {kills} OOM kills, holder {exit}; {v:?}",
        usage >> 20,
        settled.as_millis(),
        HIGH >> 20,
        peak.map(|p| p >> 20),
    );
    println!("{line}");
    assert_eq!(kills, 0, "{line}");
    assert!(usage <= HIGH as u64, "still over memory.high: {line}");
    assert_eq!(v.u64("pinned_ok"), 1, "pinned data lost: {line}");
    assert_eq!(v.u64("bad"), 0, "{line}");
    let pages = (VOLATILE / vrange::page_size()) as u64;
    assert_eq!(v.u64("zero") + v.u64("intact"), pages, "{line}");
    assert_eq!(v.u64("reported"), v.u64("zero"), "exact: {line}");
    // The group held more than the threshold: at least the excess went, and the headroom
    // (memory.high) is what took it.
    let excess = (PINNED + VOLATILE - HIGH) as u64;
    assert!(
        v.u64("purged_bytes") >= excess,
        "purged less than the excess: {line}"
    );
    assert!(
        v.u64("headroom_bytes") > 0,
        "the headroom source purged nothing: {line}"
    );
}
