//! The core as a guest: its descriptors sit above the floor, close-on-exec, and a program that
//! closes them (or puts its own files at their numbers) loses nothing and keeps vrange working.
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

#[test]
fn the_reclaimer_reopens_sources_the_program_closed() {
    let _serial = serial();
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
    wait_for("the reclaimer's sources", Duration::from_secs(5), || {
        vrange::stats().descriptors_held > 0
    });
    let ours = fds_from(floor);
    assert!(!ours.is_empty(), "no descriptor above the floor {floor}");
    for (fd, what) in &ours {
        // SAFETY: F_GETFD has no memory effects.
        let flags = unsafe { libc::fcntl(*fd, libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC, "{fd} {what}");
    }
    // The program closes everything above the floor and opens a file at the first number.
    let lost = vrange::stats().descriptors_lost;
    close_from(floor);
    let file = std::fs::File::create(
        std::env::temp_dir().join(format!("vrange-guest-{}", std::process::id())),
    )
    .unwrap();
    // SAFETY: dup2 between this test's descriptors.
    let placed = unsafe { libc::dup2(file.as_raw_fd(), ours[0].0) };
    assert_eq!(placed, ours[0].0);
    wait_for(
        "the lost sources to be noticed",
        Duration::from_secs(5),
        || vrange::stats().descriptors_lost > lost,
    );
    wait_for("the sources to be reopened", Duration::from_secs(5), || {
        fds_from(floor).len() > 1
    });
    // Wakes (a budget crossing) and purges still work, and never touched the program's file.
    vrange::set_option("VRANGE_BUDGET", "1M").unwrap();
    wait_for("the budget purge", Duration::from_secs(5), || {
        vrange::stats().purged_bytes > 0
    });
    vrange::set_option("VRANGE_BUDGET", "0").unwrap();
    assert!(region.unmark().unwrap().was_purged());
    assert_eq!(
        file.metadata().unwrap().len(),
        0,
        "the program's file was written"
    );
    // SAFETY: the test's own descriptor.
    unsafe { libc::close(ours[0].0) };
    let _ = std::fs::remove_file(
        std::env::temp_dir().join(format!("vrange-guest-{}", std::process::id())),
    );
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
            !vrange_sys::probe::features().procmap_query,
            "the range check keeps no descriptor",
        );
    }
    assert_eq!(
        maps.len(),
        1,
        "the cached maps descriptor is not above the floor"
    );
    let file = std::fs::File::open("/proc/self/status").unwrap();
    // SAFETY: the program closes vrange's descriptor and dup2s its own file there.
    unsafe {
        libc::close(maps[0]);
        assert_eq!(libc::dup2(file.as_raw_fd(), maps[0]), maps[0]);
    }
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
        blocked = std::fs::read_dir("/proc/self/task")
            .unwrap()
            .flatten()
            .find_map(|t| {
                let status = std::fs::read_to_string(t.path().join("status")).ok()?;
                status
                    .lines()
                    .next()?
                    .ends_with("vrange-reclaim")
                    .then(|| {
                        let mask = status.lines().find_map(|l| l.strip_prefix("SigBlk:"))?;
                        u64::from_str_radix(mask.trim(), 16).ok()
                    })?
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
