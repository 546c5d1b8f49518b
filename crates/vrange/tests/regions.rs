//! The region table: one lookup names the library-owned region of any kind holding an address
//! (`region_containing`), one call frees any kind by its exact extent (`free_region`, what
//! `vrange_free` does), and the classic call refuses memory it must not pin (scratch and refill
//! regions) while treating the rest by kind.

use vrange::{
    free_region, mark_volatile, page_size, region_containing, unmark, Error, Options, RefillRegion,
    ScratchRegion, VolatileRegion,
};
use vrange_testkit::skip_lacking;

/// Checks that `[p, p + len)` is found whole from inside it, is refused by a wrong extent,
/// freed by the right one, and then no longer found.
fn found_then_freed(p: *mut u8, len: usize) {
    let page = page_size();
    for inside in [0, page, len - 1] {
        // SAFETY: only addresses are computed, inside the region.
        let at = unsafe { p.add(inside) };
        assert_eq!(region_containing(at), Some((p, len)), "+{inside:#x}");
    }
    // SAFETY: a wrong extent names no region: nothing is freed.
    assert_eq!(unsafe { free_region(p, len - page) }, Err(Error::NotRegion));
    // SAFETY: the region was given up with `into_raw` and nothing uses it any more.
    unsafe { free_region(p, len) }.expect("free_region of the exact extent");
    assert_eq!(region_containing(p), None);
    // SAFETY: freed already: a second free names no region.
    assert_eq!(unsafe { free_region(p, len) }, Err(Error::NotRegion));
}

#[test]
fn a_volatile_region_is_found_by_address_and_freed_by_its_extent() {
    let page = page_size();
    let (p, len) = VolatileRegion::new(8 * page, Options::default())
        .expect("region")
        .into_raw();
    found_then_freed(p, len);
}

#[test]
fn a_scratch_region_is_found_by_address_refused_by_the_classic_call_and_freed() {
    let page = page_size();
    let r = match ScratchRegion::new(16 * page) {
        Ok(r) => r,
        Err(Error::Os(libc::ENOTSUP)) => {
            return skip_lacking(
                "MAP_DROPPABLE (Linux 6.11)",
                !vrange::features().map_droppable,
                "scratch regions are refused",
            )
        }
        Err(e) => panic!("ScratchRegion::new: {e}"),
    };
    // SAFETY: the classic call refuses before touching anything.
    let marked = unsafe { mark_volatile(r.as_ptr(), page) };
    assert_eq!(marked, Err(Error::Unsupported));
    // A span reaching past its end straddles its boundary.
    // SAFETY: refused before touching anything.
    let past = unsafe { unmark(r.as_ptr().add(15 * page), 2 * page) };
    assert!(past.is_err(), "{past:?}");
    let (p, len) = r.into_raw();
    found_then_freed(p, len);
}

#[test]
fn a_refill_region_is_found_by_address_refused_by_the_classic_call_and_freed() {
    let page = page_size();
    let r = match RefillRegion::new(16 * page, page, |_, buf| {
        buf.fill(7);
        true
    }) {
        Ok(r) => r,
        Err(Error::Os(libc::ENOTSUP)) => {
            return skip_lacking(
                "userfaultfd",
                !vrange::features().userfaultfd && vrange::features().userfaultfd_dev.is_err(),
                "refill regions are refused",
            )
        }
        Err(e) => panic!("RefillRegion::new: {e}"),
    };
    // Its content is its fill function's: neither marked nor pinned by the classic call.
    // SAFETY: refused before touching anything.
    let marked = unsafe { mark_volatile(r.as_ptr(), page) };
    assert_eq!(marked, Err(Error::Unsupported));
    // SAFETY: as above.
    let unmarked = unsafe { unmark(r.as_ptr(), page) };
    assert_eq!(unmarked.err(), Some(Error::Unsupported));
    // SAFETY: the first byte is made by the fill function on touch.
    assert_eq!(unsafe { r.as_ptr().read_volatile() }, 7);
    let (p, len) = r.into_raw();
    found_then_freed(p, len);
}

#[test]
fn memory_of_no_region_is_not_found_nor_freed() {
    let page = page_size();
    let mut v = vec![0u8; 4 * page];
    assert_eq!(region_containing(v.as_ptr()), None);
    let aligned = ((v.as_mut_ptr() as usize + page - 1) & !(page - 1)) as *mut u8;
    // SAFETY: names no region: nothing is freed.
    let freed = unsafe { free_region(aligned, page) };
    assert_eq!(freed, Err(Error::NotRegion));
}
