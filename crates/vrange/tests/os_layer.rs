//! The OS layer's tests that touch what a kernel may lack (PAGEMAP_SCAN, a memory cgroup the
//! tests may use), here rather than in vrange-sys so that they take the test kit's skip
//! policy (a skip fails under CI unless the feature probe confirms the lack) without the OS
//! layer depending on the test kit.

use std::path::Path;
use vrange_sys::cgroup::{unique_name, MemCgroup};
use vrange_sys::mem;
use vrange_sys::pagemap::huge_runs;
use vrange_testkit::{skip, skip_lacking};

#[test]
fn a_written_huge_page_is_one_run_and_a_split_one_is_none() {
    const HUGE: usize = mem::HUGE_PAGE;
    let map = mem::map_anon(2 * HUGE, HUGE).unwrap();
    let base = map.as_ptr() as usize;
    // SAFETY: the mapping is ours, 2 MiB-aligned and 2 MiB long at least.
    unsafe {
        mem::advise_huge(map.as_ptr(), HUGE, true).unwrap();
        std::ptr::write_bytes(map.as_ptr(), 0xA5, HUGE);
    }
    let mut seen = Vec::new();
    let scanned = huge_runs(base, base + 2 * HUGE, |s, e| seen.push((s, e))).unwrap();
    if !scanned {
        skip_lacking(
            "PAGEMAP_SCAN (Linux 6.7)",
            !vrange::features().pagemap_scan,
            "huge_runs answers that it cannot tell",
        );
    } else if seen.is_empty() {
        skip("the kernel gave the test mapping no huge page");
    } else {
        assert_eq!(seen, vec![(base, base + HUGE)]);
        // Dropping one 4 KiB page splits the huge mapping.
        // SAFETY: the page is ours and its content is not needed.
        unsafe { mem::purge_forced(map.as_ptr().add(4096), 4096).unwrap() };
        seen.clear();
        assert!(huge_runs(base, base + 2 * HUGE, |s, e| seen.push((s, e))).unwrap());
        assert!(seen.is_empty(), "{seen:x?}");
    }
    // SAFETY: the mapping is ours and no longer used.
    unsafe { mem::unmap(map, 2 * HUGE) };
}

#[test]
fn child_cgroup_round_trip() {
    // Where the test runner says children go (cgroup v2: a sibling of its own leaf).
    let named = std::env::var_os("VRANGE_TEST_CGROUP").and_then(|d| MemCgroup::at(Path::new(&d)));
    let Some(cg) = named.or_else(MemCgroup::current) else {
        return skip("no memory cgroup");
    };
    let child = cg
        .create_child(&unique_name("vrange-test-"), 64 << 20)
        .expect("create child cgroup");
    let dir = child.cgroup().path().to_path_buf();
    assert!(dir.is_dir());
    assert_eq!(child.cgroup().limit(), Some(64 << 20));
    child.set_limit(32 << 20).unwrap();
    assert_eq!(child.cgroup().limit(), Some(32 << 20));
    assert_eq!(child.cgroup().oom_kills().unwrap(), 0);
    child.cgroup().usage().unwrap();

    // A process still inside must not keep the directory alive.
    let mut sleeper = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let pid = sleeper.id() as i32;
    child.add_pid(pid).unwrap();
    let procs = std::fs::read_to_string(child.cgroup().file("cgroup.procs")).unwrap();
    assert!(procs.split_whitespace().any(|p| p == pid.to_string()));

    drop(child);
    let gone = !dir.exists();
    let _ = sleeper.kill();
    let _ = sleeper.wait();
    assert!(gone, "{} left behind", dir.display());
}

/// UFFDIO_MOVE on the real kernel (`vrange_sys::uffd::move_pages`): the source's pages land in
/// the missing pages of a registered range in one call and leave the source; a present
/// destination page is kept with the source page across from it; a missing source page gives
/// the zero page (or is skipped); a move target takes no fault (its missing page faults in as
/// usual); a page shared with a fork child is refused (EBUSY), as is every move where the
/// kernel has none (EINVAL).
#[test]
fn moves_fill_missing_pages_keep_present_ones_and_refuse_shared_ones() {
    use vrange_sys::uffd::{self, SrcHole};
    // It forks.
    let _s = vrange_testkit::serial();
    let page = mem::page_size();
    let Ok((fd, _)) = uffd::open_sigbus() else {
        return skip("userfaultfd is not available to this process");
    };
    let fd = std::os::fd::AsRawFd::as_raw_fd(&fd);
    let (dst_map, src_map) = (
        mem::map_anon(8 * page, page).unwrap(),
        mem::map_anon(4 * page, page).unwrap(),
    );
    let unmap = || {
        // SAFETY: the test's own mappings; nothing refers into them any more.
        unsafe {
            mem::unmap(dst_map, 8 * page);
            mem::unmap(src_map, 4 * page);
        }
    };
    let (dst, src) = (dst_map.as_ptr() as usize, src_map.as_ptr() as usize);
    let word = |at: usize| {
        // SAFETY: a present page of the test's own mappings.
        unsafe { (at as *const u64).read_volatile() }
    };
    uffd::register_missing(fd, dst, 8 * page).unwrap();
    uffd::register_move_target(fd, src, 4 * page).unwrap();
    for i in 0..4 {
        // SAFETY: the test's own mapping.
        unsafe { ((src + i * page) as *mut u64).write_volatile(i as u64 + 1) };
    }
    // Destination page 1 present already; source page 2 missing.
    let ninety_nine = [99u64; 512];
    // SAFETY: the buffer holds a page; dst + page is registered and missing.
    unsafe { uffd::copy(fd, dst + page, ninety_nine.as_ptr().cast(), page) }.unwrap();
    // SAFETY: the test's own page, its content not needed.
    unsafe { mem::purge_forced((src + 2 * page) as *mut u8, page) }.unwrap();
    // SAFETY: the source is the test's own, its content wanted at the destination.
    let moved = unsafe { uffd::move_pages(fd, dst, src, 4 * page, SrcHole::Zero) };
    if !vrange::features().uffd_move {
        let refused = moved.expect_err("no moves on this kernel");
        assert_eq!(refused.at, 0);
        assert_eq!(refused.error.raw_os_error(), Some(libc::EINVAL));
        unmap();
        return skip_lacking(
            "UFFDIO_MOVE (Linux 6.8)",
            true,
            "the kernel refuses the move (EINVAL), as the probe found",
        );
    }
    assert_eq!(moved.unwrap(), 2 * page, "pages 0 and 3 moved");
    assert_eq!(
        [0, 1, 2, 3].map(|i| word(dst + i * page)),
        [1, 99, 0, 4],
        "moved, kept, the zero page, moved"
    );
    assert_eq!(
        word(src + page),
        2,
        "the page across from a present one stays"
    );
    assert_eq!(mem::resident_pages(src as *mut u8, 4 * page).unwrap(), 1);
    assert_eq!(
        word(src),
        0,
        "a move target faults in a zero page, no signal"
    );
    // Skipping holes: the destination page across from one stays missing.
    // SAFETY: as above.
    unsafe { ((src + 3 * page) as *mut u64).write_volatile(7) };
    // SAFETY: as above; page 2 of the source is missing.
    let moved =
        unsafe { uffd::move_pages(fd, dst + 4 * page, src + 2 * page, 2 * page, SrcHole::Skip) };
    assert_eq!(moved.unwrap(), 2 * page, "a skipped hole counts as moved");
    assert_eq!(
        mem::resident_pages((dst + 4 * page) as *mut u8, 2 * page).unwrap(),
        1,
        "the hole left its page missing"
    );
    assert_eq!(word(dst + 5 * page), 7);
    // A page shared with a fork child is not this mapping's alone.
    // SAFETY: as above.
    unsafe { (src as *mut u64).write_volatile(5) };
    let (mut child, link) = vrange_testkit::fork::fork_linked(|link| {
        let _ = link.recv::<1>(std::time::Duration::from_secs(30));
        0
    });
    // SAFETY: as above.
    let shared = unsafe { uffd::move_pages(fd, dst + 6 * page, src, page, SrcHole::Zero) };
    drop(link);
    child.wait(std::time::Duration::from_secs(30));
    let refused = shared.expect_err("a shared page is not moved");
    assert_eq!(
        (refused.at, refused.error.raw_os_error()),
        (0, Some(libc::EBUSY))
    );
    assert_eq!(word(src), 5, "a refused page stays");
    unmap();
}
