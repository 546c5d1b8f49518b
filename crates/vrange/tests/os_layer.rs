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
