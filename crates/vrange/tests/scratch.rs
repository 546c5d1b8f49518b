//! Scratch regions on the real kernel (MAP_DROPPABLE): a terabyte reserves nothing, the classic
//! call refuses them, a fork child sees zeroes, and writing four times a memory cgroup's limit
//! into one completes without an OOM kill, dropped pages reading zero, while the same writes
//! into ordinary memory are OOM-killed (the control run, shown).
//!
//! The cgroup scenario runs in re-executed processes of this test binary (see
//! `vrange_testkit::role`), each joining a fresh child cgroup before it maps anything.

use std::time::Duration;
use vrange::{Error, ScratchRegion};
use vrange_sys::cgroup::join_before_exec;
use vrange_testkit::fork::fork_linked;
use vrange_testkit::pattern::{check_at, fill, is_zero};
use vrange_testkit::proc::Exit;
use vrange_testkit::role::{role, role_command, say, Role};
use vrange_testkit::{cgroup, serial, skip, skip_lacking};

const MIB: usize = 1 << 20;
const TIB: usize = 1 << 40;

/// None (with a printed reason) where the kernel has no MAP_DROPPABLE.
fn scratch(len: usize) -> Option<ScratchRegion> {
    match ScratchRegion::new(len) {
        Ok(r) => Some(r),
        Err(Error::Os(libc::ENOTSUP)) => {
            skip_lacking(
                "MAP_DROPPABLE (Linux 6.11)",
                !vrange::features().map_droppable,
                "scratch regions are refused",
            );
            None
        }
        Err(e) => panic!("ScratchRegion::new({len}): {e}"),
    }
}

fn committed_kb() -> u64 {
    vrange_sys::procfs::meminfo_kb("Committed_AS")
        .expect("read /proc/meminfo")
        .expect("Committed_AS")
}

fn vm_pte_kb() -> u64 {
    vrange_sys::procfs::status(None)
        .expect("/proc/self/status")
        .vm_pte_kb
}

#[test]
fn a_terabyte_reserves_no_memory_commit_or_page_tables() {
    let _s = serial();
    let before = (committed_kb(), vm_pte_kb(), vrange::stats());
    let Some(r) = scratch(TIB) else { return };
    let after = (committed_kb(), vm_pte_kb(), vrange::stats());
    assert_eq!(r.len(), TIB);
    // Other processes move Committed_AS too; a TiB charged would be 1,073,741,824 kB.
    assert!(
        after.0.abs_diff(before.0) < (1 << 20),
        "Committed_AS moved from {} kB to {} kB",
        before.0,
        after.0
    );
    // The harness's other threads (a test thread starting, its stack and heap) add a page
    // table now and then: 3 were seen under load. A terabyte with its page tables would be
    // 4 MiB of middle-level tables alone, and 2 GiB of page tables once touched.
    assert!(
        after.1 <= before.1 + 256,
        "VmPTE {} kB -> {} kB",
        before.1,
        after.1
    );
    assert_eq!(after.2.scratch_regions, before.2.scratch_regions + 1);
    assert_eq!(after.2.scratch_bytes, before.2.scratch_bytes + TIB as u64);
    // One page per GiB written: memory and page tables for those alone.
    let page = vrange::page_size();
    for gib in 0..1024 {
        fill(r.as_ptr().wrapping_add(gib << 30), page, gib as u64);
    }
    let resident = r.resident_bytes().unwrap();
    // Where THP is on for every mapping, each write faults in a whole huge page.
    let unit = match vrange_sys::probe::thp_mode() {
        vrange_sys::probe::ThpMode::Always => vrange_sys::mem::HUGE_PAGE,
        _ => page,
    };
    assert!(resident <= 1024 * unit, "{resident} bytes resident");
    drop(r);
    let end = vrange::stats();
    assert_eq!(
        (end.scratch_regions, end.scratch_bytes),
        (before.2.scratch_regions, before.2.scratch_bytes)
    );
}

#[test]
fn the_classic_call_refuses_scratch_memory() {
    let _s = serial();
    let Some(r) = scratch(4 * MIB) else { return };
    let page = vrange::page_size();
    // SAFETY: the region is ours; the calls must refuse it without touching it.
    unsafe {
        assert_eq!(
            vrange::mark_volatile(r.as_ptr(), r.len()),
            Err(Error::Unsupported)
        );
        assert_eq!(
            vrange::mark_volatile(r.as_ptr().add(page), page),
            Err(Error::Unsupported)
        );
        assert_eq!(vrange::unmark(r.as_ptr(), page), Err(Error::Unsupported));
    }
    assert_eq!(Error::Unsupported.errno(), libc::EINVAL);
}

#[test]
fn from_raw_takes_back_only_a_live_scratch_region_exactly() {
    let _s = serial();
    let Some(r) = scratch(3 * MIB + 1) else {
        return;
    };
    let (ptr, len) = r.into_raw();
    assert_eq!(len, 3 * MIB + vrange::page_size(), "rounded up to a page");
    // SAFETY: probing only: these name no region, so nothing is taken.
    unsafe {
        assert_eq!(
            ScratchRegion::from_raw(ptr, len + vrange::page_size()).err(),
            Some(Error::NotRegion)
        );
        assert_eq!(
            ScratchRegion::from_raw(ptr.add(vrange::page_size()), MIB).err(),
            Some(Error::NotRegion)
        );
    }
    // SAFETY: ptr and len came from into_raw; no other handle exists.
    let r = unsafe { ScratchRegion::from_raw(ptr, len - 1) }.expect("the live region");
    drop(r);
    // SAFETY: probing a region just freed: refused, nothing taken.
    let again = unsafe { ScratchRegion::from_raw(ptr, len) };
    assert_eq!(again.err(), Some(Error::NotRegion));
}

#[test]
fn a_fork_child_sees_zeroes() {
    let _s = serial();
    let Some(r) = scratch(MIB) else { return };
    fill(r.as_ptr(), r.len(), 7);
    let base = r.as_ptr() as usize;
    let (mut child, _link) = fork_linked(|_| {
        // Allocation-free: reads only.
        if is_zero(base as *const u8, MIB) {
            0
        } else {
            1
        }
    });
    assert_eq!(
        child.wait(Duration::from_secs(30)),
        Exit::Code(0),
        "the child's copy of a scratch region is wiped"
    );
    // The parent's pages are its own (nothing pressed on them meanwhile; a drop would be zero).
    let page = vrange::page_size();
    for off in (0..r.len()).step_by(page) {
        assert!(
            check_at(r.as_ptr(), off, page, 7) || is_zero(r.as_ptr().wrapping_add(off), page),
            "page at {off} is neither its content nor zero"
        );
    }
}

// ---- Under a memory cgroup's limit ----

const LIMIT: usize = 64 * MIB;
const WRITTEN: usize = 4 * LIMIT;
const PRESSURE_TEST: &str = "writing_four_times_the_cgroup_limit_completes_and_drops_read_zero";
const SCRATCH_WRITER: &str = "scratch-writer";
const ORDINARY_WRITER: &str = "ordinary-writer";

/// In a role process: writes `WRITTEN` bytes, page by page, each page its own pattern, then
/// reads every page back and says how many were kept, dropped (all zero) or neither.
fn writer(scratch: bool) {
    vrange_testkit::hog::prefer_oom_kill().expect("write oom_score_adj");
    let page = vrange::page_size();
    let (base, _keep) = if scratch {
        let r = ScratchRegion::new(WRITTEN).expect("scratch region");
        (r.as_ptr(), Some(r))
    } else {
        let p = vrange_sys::mem::map_anon(WRITTEN, page).expect("mmap");
        (p.as_ptr(), None)
    };
    for off in (0..WRITTEN).step_by(page) {
        fill(base.wrapping_add(off), page, off as u64);
    }
    let (mut kept, mut dropped, mut corrupt) = (0, 0, 0);
    for off in (0..WRITTEN).step_by(page) {
        let p = base.wrapping_add(off);
        // Zero first: a page dropped between two reads must not count as corrupt.
        if is_zero(p, page) {
            dropped += 1;
        } else if vrange_testkit::pattern::check(p, page, off as u64) {
            kept += 1;
        } else if is_zero(p, page) {
            dropped += 1;
        } else {
            corrupt += 1;
        }
    }
    let st = vrange::stats();
    say(format!(
        "DONE kept={kept} dropped={dropped} corrupt={corrupt} scratch_bytes={}",
        st.scratch_bytes
    ));
}

fn run_writer(test: &str, which: &str) -> Option<(Exit, Option<vrange_testkit::role::Reply>, u64)> {
    let child = match cgroup::child("vrange-scratch-", LIMIT as u64) {
        Ok(c) => c,
        Err(why) => {
            skip(why);
            return None;
        }
    };
    let cg = child.cgroup().clone();
    let mut cmd = role_command(test, which);
    join_before_exec(&mut cmd, &cg.file("cgroup.procs")).expect("open cgroup.procs");
    let mut p = Role::spawn(which, cmd);
    let reply = p.next(Duration::from_secs(120)).ok();
    let exit = p.wait(Duration::from_secs(30));
    let kills = cg.oom_kills().expect("read the OOM kill count");
    drop(p);
    cgroup::remove(child);
    Some((exit, reply, kills))
}

#[test]
fn writing_four_times_the_cgroup_limit_completes_and_drops_read_zero() {
    match role().as_deref() {
        Some(SCRATCH_WRITER) => return writer(true),
        Some(ORDINARY_WRITER) => return writer(false),
        Some(other) => panic!("unknown role {other:?}"),
        None => {}
    }
    let _s = serial();
    if scratch(vrange::page_size()).is_none() {
        return;
    }
    let Some((exit, reply, kills)) = run_writer(PRESSURE_TEST, SCRATCH_WRITER) else {
        return;
    };
    let pages = (WRITTEN / vrange::page_size()) as u64;
    let reply = reply.unwrap_or_else(|| panic!("the scratch writer did not finish: {exit}"));
    println!(
        "scratch: {} MiB written under a {} MiB limit: {} pages kept, {} dropped, {} corrupt; \
         OOM kills {kills}",
        WRITTEN >> 20,
        LIMIT >> 20,
        reply.u64("kept"),
        reply.u64("dropped"),
        reply.u64("corrupt")
    );
    assert_eq!(exit, Exit::Code(0));
    assert_eq!(kills, 0, "no OOM kill for scratch memory");
    assert_eq!(reply.u64("corrupt"), 0, "a page is its content or zero");
    assert_eq!(reply.u64("kept") + reply.u64("dropped"), pages);
    // At most the limit can be kept: three quarters at least were dropped.
    assert!(reply.u64("dropped") >= pages * 3 / 4, "{reply:?}");
    assert_eq!(reply.u64("scratch_bytes"), WRITTEN as u64);

    // The control: the same writes into ordinary memory are OOM-killed.
    let Some((exit, reply, kills)) = run_writer(PRESSURE_TEST, ORDINARY_WRITER) else {
        return;
    };
    println!("ordinary memory: {exit}, OOM kills {kills}");
    assert!(reply.is_none(), "ordinary memory cannot hold 4x the limit");
    assert_eq!(exit, Exit::Signal(libc::SIGKILL));
    assert!(kills >= 1, "killed by the OOM killer");
}
