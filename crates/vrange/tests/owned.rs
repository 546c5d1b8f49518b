//! `OwnedRange`, the client-managed range an allocator's free spans use, on the real kernel:
//! purged by the reclaimer path, armed and dropped by the kernel, taken back whole or by its
//! tail with exact reports, grown and merged with the volatile gauge kept right.

use std::time::{Duration, Instant};
use vrange::{Content, OwnedRange, Policy, Priority};
use vrange_sys::mem;

mod common;
use common::Mapping;
use vrange_testkit::pattern::{check, check_at, fill, is_zero};
use vrange_testkit::serial;

const MIB: usize = 1 << 20;

/// These tests decide every purge themselves: pressure left on the machine by other tests
/// (PSI's window is system-wide) must not purge their ranges behind their back.
fn quiet() -> std::sync::MutexGuard<'static, ()> {
    for (name, value) in [
        ("VRANGE_PSI", "off"),
        ("VRANGE_VMPRESSURE", "off"),
        ("VRANGE_HEADROOM", "off"),
    ] {
        vrange::set_option(name, value).unwrap();
    }
    serial()
}

fn wait_armed(bytes: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while vrange::stats().armed_bytes < bytes {
        assert!(Instant::now() < deadline, "the range was not armed");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn purged_range_is_taken_back_zero() {
    let _s = quiet();
    let m = Mapping::aligned(2 * MIB, 2 * MIB, false);
    fill(m.page(0), 2 * MIB, 1);
    let start = m.page(0) as usize;
    // SAFETY: the mapping is this test's; its content is given up.
    let mut r = unsafe {
        OwnedRange::new(
            start,
            2 * MIB,
            Policy::Managed,
            Priority::DropFirst,
            Content::Dirty,
        )
    }
    .unwrap();
    let tail = r.take_tail(MIB / 2);
    assert_eq!(
        (tail.pages, tail.purged, tail.zero),
        (128, 0, false),
        "intact tail"
    );
    assert!(check_at(m.page(0), 3 * MIB / 2, MIB / 2, 1));
    assert!(vrange::purge(usize::MAX) >= 3 * MIB / 2);
    assert_eq!(r.extent(), (start, 3 * MIB / 2));
    let all = r.take();
    assert_eq!((all.pages, all.purged, all.zero), (384, 384, true));
    assert!(is_zero(m.page(0), 3 * MIB / 2));
    assert!(
        check_at(m.page(0), 3 * MIB / 2, MIB / 2, 1),
        "the tail taken before the purge kept its data"
    );
}

#[test]
fn armed_range_reports_kernel_drops_exactly() {
    let _s = quiet();
    // MADV_PAGEOUT discards lazy folios advised on its own CPU: pin, and restart the reclaimer
    // from this thread so that it inherits the affinity and arms on this CPU.
    mem::pin_thread_to_current_cpu().unwrap();
    vrange::reclaimer::stop();
    vrange::set_option("VRANGE_ARM_DELAY_MS", "0").unwrap();
    let m = Mapping::aligned(2 * MIB, 2 * MIB, false);
    fill(m.page(0), 2 * MIB, 2);
    let start = m.page(0) as usize;
    // SAFETY: as above.
    let mut r = unsafe {
        OwnedRange::new(
            start,
            2 * MIB,
            Policy::Hybrid,
            Priority::Normal,
            Content::Dirty,
        )
    }
    .unwrap();
    wait_armed(2 * MIB as u64);
    // The kernel drops the last quarter.
    mem::reclaim_now(m.page(384), MIB / 2).unwrap();
    let tail = r.take_tail(3 * MIB / 4);
    assert_eq!(tail.pages, 192);
    assert_eq!(tail.purged, 128, "exactly the dropped pages of the tail");
    assert!(!tail.zero, "part of the tail survived");
    assert!(
        check_at(m.page(0), 5 * MIB / 4, MIB / 4, 2),
        "surviving pages keep their data"
    );
    assert!(is_zero(m.page(384), MIB / 2));
    let head = r.take();
    assert_eq!(
        (head.pages, head.purged),
        (320, 0),
        "the head was never dropped"
    );
    assert!(check(m.page(0), 5 * MIB / 4, 2));
    vrange::set_option("VRANGE_ARM_DELAY_MS", "1000").unwrap();
}

#[test]
fn grow_and_absorb_keep_the_volatile_gauge() {
    let _s = quiet();
    let m = Mapping::aligned(4 * MIB, 2 * MIB, false);
    let start = m.page(0) as usize;
    let before = vrange::stats().volatile_bytes;
    // SAFETY: as above, for each piece.
    let (mut a, b) = unsafe {
        (
            OwnedRange::new(
                start,
                MIB,
                Policy::Managed,
                Priority::Normal,
                Content::Dirty,
            )
            .unwrap(),
            OwnedRange::new(
                start + 2 * MIB,
                MIB,
                Policy::Managed,
                Priority::Normal,
                Content::Zero,
            )
            .unwrap(),
        )
    };
    assert_eq!(
        vrange::stats().volatile_bytes - before,
        MIB as u64,
        "a zero range is purged"
    );
    // SAFETY: the added megabyte is given up too.
    unsafe { a.grow(start, 2 * MIB) };
    a.absorb(b);
    assert_eq!(a.extent(), (start, 3 * MIB));
    assert_eq!(vrange::stats().volatile_bytes - before, 3 * MIB as u64);
    let t = a.take_tail(MIB);
    assert!(!t.zero, "a merged range is dirty as a whole");
    assert_eq!(vrange::stats().volatile_bytes - before, 2 * MIB as u64);
    drop(a);
    assert_eq!(
        vrange::stats().volatile_bytes,
        before,
        "dropping unregisters"
    );
}
