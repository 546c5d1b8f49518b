//! Huge pages (`VRANGE_MALLOC_THP=always`, set here before the first allocation; the default
//! keeps chunks on small pages): chunks are THP-backed where THP allows, and the allocator never splits a huge
//! page to give memory back lazily. A free span smaller than its chunk stays managed (marking
//! it is an atomic operation, nothing reaches the kernel); only a whole free chunk is armed,
//! with MADV_FREE over the whole PMD, which the kernel applies to the huge page without
//! splitting it. The measurement is checked to see a split by splitting a huge page on purpose.

use std::time::{Duration, Instant};
use vrange::ThpMode;
use vrange_malloc::heap;

const CHUNK: usize = 2 << 20;

/// AnonHugePages (kB) of the mapping holding `addr`, from /proc/self/smaps.
fn huge_kb(addr: usize) -> u64 {
    vrange_sys::procfs::smaps_of(addr)
        .expect("smaps")
        .map_or(0, |s| s.anon_huge_kb)
}

fn wait_armed(bytes: u64) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if vrange::stats().armed_bytes >= bytes {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

#[test]
fn freeing_never_splits_a_huge_page() {
    if matches!(
        vrange::features().thp,
        ThpMode::Never | ThpMode::Unavailable
    ) {
        vrange_testkit::skip("transparent huge pages are off on this machine");
        return;
    }
    // MADV_PAGEOUT below discards lazy folios only if they were advised on its CPU: pin this
    // thread before the first allocation starts the reclaimer, which inherits the affinity.
    vrange_sys::mem::pin_thread_to_current_cpu().expect("pin to a CPU");
    vrange_malloc::config::set_thp(vrange_malloc::Thp::Always);
    vrange::set_option("VRANGE_ARM_DELAY_MS", "0").unwrap();
    // Only this test purges: pressure other tests left on the machine (PSI's window is
    // system-wide) must not.
    for name in ["VRANGE_PSI", "VRANGE_VMPRESSURE", "VRANGE_HEADROOM"] {
        vrange::set_option(name, "off").unwrap();
    }
    // A fresh chunk, touched whole: one huge page.
    let big = heap::alloc(CHUNK - (512 << 10), 16)
        .expect("served")
        .ptr
        .as_ptr();
    let small = heap::alloc(512 << 10, 16).expect("served").ptr.as_ptr();
    let base = big as usize & !(CHUNK - 1);
    assert_eq!(
        small as usize & !(CHUNK - 1),
        base,
        "both blocks in one chunk"
    );
    // SAFETY: both blocks are live and together cover the chunk.
    unsafe {
        big.write_bytes(1, CHUNK - (512 << 10));
        small.write_bytes(2, 512 << 10);
    }
    let before = huge_kb(base);
    if before < 2048 {
        vrange_testkit::skip(format_args!(
            "no huge page was available for the chunk ({before} kB)"
        ));
        return;
    }
    // Part of the chunk free: managed, never armed.
    // SAFETY: live, freed once.
    assert!(unsafe { heap::free(small) });
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        vrange::stats().armed_bytes,
        0,
        "a partial free span is not armed"
    );
    assert_eq!(
        huge_kb(base),
        before,
        "freeing part of a chunk split its huge page"
    );
    // The whole chunk free: armed with one MADV_FREE over the PMD, the huge page kept whole.
    // SAFETY: live, freed once.
    assert!(unsafe { heap::free(big) });
    assert!(wait_armed(CHUNK as u64), "the free chunk was armed");
    assert_eq!(
        huge_kb(base),
        before,
        "arming a whole chunk split its huge page"
    );
    // The kernel may now drop it whole; reuse reports it purged, and zero.
    vrange_sys::mem::reclaim_now(base as *mut u8, CHUNK).expect("MADV_PAGEOUT");
    let again = heap::alloc(CHUNK, 16).expect("served");
    assert_eq!(again.ptr.as_ptr() as usize, base);
    assert!(
        again.zeroed,
        "the dropped huge page is reported purged: zero"
    );
    // SAFETY: live, freed once.
    assert!(unsafe { heap::free(again.ptr.as_ptr()) });

    // The measurement sees a split: MADV_FREE on part of a huge page splits it. (A large
    // block: a fresh mapping, since the chunk above is now mapped by 4 KiB entries.)
    let probe = heap::alloc(CHUNK + 1, 16).expect("served").ptr.as_ptr();
    // SAFETY: a live block of two chunks.
    unsafe { probe.write_bytes(3, 2 * CHUNK) };
    let whole = huge_kb(probe as usize);
    // SAFETY: part of a live block this test owns and no longer reads.
    let _ = unsafe { vrange_sys::mem::purge_lazy(probe.add(CHUNK / 2), 64 << 10) };
    assert!(
        huge_kb(probe as usize) < whole,
        "a partial MADV_FREE must split the huge page ({whole} kB before)"
    );
    // SAFETY: live, freed once.
    assert!(unsafe { heap::free(probe) });
}
