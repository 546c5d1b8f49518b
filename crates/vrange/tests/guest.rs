//! The core as a guest: its descriptors sit above the floor, close-on-exec (the reclaimer's
//! sources in a table of its own), and a program that closes them (or puts its own files at
//! their numbers) loses nothing and keeps vrange working.
//! vrange-malloc's `tests/guest.rs` runs the same rules through real programs under the shim.
//!
//! The tests of this binary run one at a time: they close descriptors by number.

// Plays the program vrange is a guest in: closes, duplicates and inspects descriptors by
// number, which vrange's own code may only do through vrange_sys (clippy.toml).
#![allow(clippy::disallowed_methods)]

mod common;
use common::Mapping;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};
use vrange::{Options, Policy, VolatileRegion};
use vrange_testkit::pattern::{check, fill};
use vrange_testkit::serial;

/// This process's descriptors at or above `from`, with what they name.
fn fds_from(from: i32) -> Vec<(i32, String)> {
    let mut out: Vec<(i32, String)> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let fd: i32 = e.file_name().to_str()?.parse().ok()?;
            let target = std::fs::read_link(e.path()).ok()?;
            (fd >= from).then(|| (fd, target.display().to_string()))
        })
        .collect();
    out.sort();
    out
}

fn close_from(fd: i32) {
    // SAFETY: close_range on this test's own descriptor table, as the program under test does.
    let rc = unsafe { libc::syscall(libc::SYS_close_range, fd as u32, u32::MAX, 0) };
    assert_eq!(rc, 0, "close_range");
}

fn wait_for(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The reclaimer keeps every descriptor of its own (sources, wake-up eventfd) in a table of its
/// own: the program's table holds none of them. A program that closes everything above the
/// floor and puts its own file there loses nothing and disturbs nothing: wake-ups and purges
/// go on, and every source stays open.
#[test]
fn the_reclaimer_keeps_its_sources_when_the_program_closes_everything() {
    let _serial = serial();
    if let Err(why) = &vrange::features().own_table {
        return vrange_testkit::skip_lacking(
            "per-thread descriptor tables (close_range, Linux 5.9)",
            true,
            format!("the reclaimer works in the program's table here: {why}"),
        );
    }
    let floor = vrange_sys::fd::floor();
    vrange::set_option("VRANGE_POLL_MS", "20").unwrap();
    let region = VolatileRegion::new(
        8 << 20,
        Options {
            policy: Policy::Managed,
            ..Options::default()
        },
    )
    .unwrap();
    fill(region.as_ptr(), region.len(), 5);
    // SAFETY: no reference into the region is held while it is volatile.
    unsafe { region.mark() }.unwrap();
    let listened = |mut s: Vec<vrange::Source>| {
        s.retain(|s| !matches!(s, vrange::Source::Budget | vrange::Source::Explicit));
        s
    };
    wait_for("the reclaimer's sources", Duration::from_secs(5), || {
        !listened(vrange::reclaimer::active_sources()).is_empty()
    });
    let sources = listened(vrange::reclaimer::active_sources());
    let ours = fds_from(floor);
    assert!(
        !ours
            .iter()
            .any(|(_, t)| t.contains("eventfd") || t.contains("pressure") || t.contains("memory.")),
        "a descriptor of the reclaimer's is in the program's table: {ours:?}"
    );
    // The program closes everything above the floor and puts a file at the floor.
    close_from(floor);
    let path = std::env::temp_dir().join(format!("vrange-guest-{}", std::process::id()));
    let file = std::fs::File::create(&path).unwrap();
    // SAFETY: dup2 between this test's descriptors.
    assert_eq!(unsafe { libc::dup2(file.as_raw_fd(), floor) }, floor);
    // A wake-up (a budget crossing) still reaches the thread, asleep in a 30 s tick, which
    // purges at once.
    vrange::set_option("VRANGE_POLL_MS", "30000").unwrap();
    std::thread::sleep(Duration::from_millis(200));
    vrange::set_option("VRANGE_BUDGET", "1M").unwrap();
    wait_for("the budget purge", Duration::from_secs(10), || {
        vrange::stats().purged_bytes > 0
    });
    vrange::set_option("VRANGE_BUDGET", "0").unwrap();
    vrange::set_option("VRANGE_POLL_MS", "100").unwrap();
    assert!(region.unmark().unwrap().was_purged());
    assert_eq!(
        listened(vrange::reclaimer::active_sources()),
        sources,
        "the reclaimer lost sources"
    );
    assert_eq!(
        file.metadata().unwrap().len(),
        0,
        "the program's file was written"
    );
    // SAFETY: F_GETFD has no memory effects: the program's file is still at that number.
    assert!(unsafe { libc::fcntl(floor, libc::F_GETFD) } >= 0);
    // SAFETY: the test's own descriptor.
    unsafe { libc::close(floor) };
    let _ = std::fs::remove_file(&path);
}

#[test]
fn the_range_check_survives_its_maps_descriptor_being_replaced() {
    let _serial = serial();
    let floor = vrange_sys::fd::floor();
    let m = Mapping::new(16 * vrange::page_size());
    fill(m.ptr, m.len, 9);
    // SAFETY: test-owned memory, no references into it.
    unsafe { vrange::mark_volatile(m.ptr, m.len) }.unwrap();
    let maps: Vec<i32> = fds_from(floor)
        .into_iter()
        .filter(|(_, t)| t.ends_with("/maps"))
        .map(|(fd, _)| fd)
        .collect();
    if !vrange_sys::vma::has_procmap_query() {
        return vrange_testkit::skip_lacking(
            "PROCMAP_QUERY (Linux 6.11)",
            !vrange::features().procmap_query,
            "the range check keeps no descriptor",
        );
    }
    assert_eq!(
        maps.len(),
        1,
        "the cached maps descriptor is not above the floor"
    );
    let file = std::fs::File::open("/proc/self/status").unwrap();
    // The program puts its own file at vrange's number. dup2 closes and replaces in one step
    // (a close first would leave the number free for another thread's descriptor for a moment).
    // SAFETY: dup2 between descriptors of this process; no memory effects.
    assert_eq!(unsafe { libc::dup2(file.as_raw_fd(), maps[0]) }, maps[0]);
    // SAFETY: as above.
    let r = unsafe { vrange::unmark(m.ptr, m.len) }.unwrap();
    assert_eq!(r.purged, 0);
    assert!(check(m.ptr, m.len, 9));
    assert!(
        vrange_sys::vma::has_procmap_query(),
        "a replaced descriptor made vrange give up PROCMAP_QUERY"
    );
    // The program's file is still open at that number.
    // SAFETY: F_GETFD has no memory effects.
    assert!(unsafe { libc::fcntl(maps[0], libc::F_GETFD) } >= 0);
    // SAFETY: the test's own descriptor.
    unsafe { libc::close(maps[0]) };
}

/// Regression: the reclaimer thread left every signal unblocked, so a signal the program blocked
/// in its own threads to keep it pending (`sigpending`, `sigwait`) was delivered to vrange's
/// thread instead and ran the program's handler at once (CPython's test_signal failed under the
/// shim).
#[test]
fn the_reclaimer_thread_blocks_every_signal() {
    let _serial = serial();
    let _region = VolatileRegion::new(1 << 20, Options::default()).unwrap();
    let mut blocked = None;
    wait_for("the reclaimer thread", Duration::from_secs(5), || {
        blocked = vrange_testkit::sched::thread_named("vrange-reclaim").and_then(|tid| {
            vrange_sys::procfs::task_status(None, tid as u32)
                .ok()?
                .sig_blk
        });
        blocked.is_some()
    });
    let blocked = blocked.unwrap();
    for sig in [
        libc::SIGINT,
        libc::SIGTERM,
        libc::SIGUSR1,
        libc::SIGUSR2,
        libc::SIGALRM,
        libc::SIGCHLD,
        libc::SIGHUP,
        libc::SIGPIPE,
        libc::SIGRTMIN() + 1,
    ] {
        assert!(
            blocked & (1 << (sig - 1)) != 0,
            "signal {sig} is not blocked in vrange-reclaim (SigBlk {blocked:016x})"
        );
    }
}
