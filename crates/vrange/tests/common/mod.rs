//! What only the core's integration tests share: test-owned mappings and forced purges. The
//! tooling every crate's tests share (page patterns, forked and re-executed processes, cgroups,
//! the serial lock) is `vrange-testkit`'s.
#![allow(dead_code)] // each test file uses its own subset

use vrange_sys::mem;

/// Forces the kernel to reclaim the range now: every clean lazy page is discarded, provided
/// the calling thread marked the pages on the CPU it runs on now (see [`pin_cpu`]).
pub fn force_purge(ptr: *mut u8, len: usize) {
    pin_cpu();
    mem::reclaim_now(ptr, len).expect("MADV_PAGEOUT");
}

/// [`force_purge`] until no page of the range is resident (at most 50 tries, 10 ms apart):
/// for a test that expects every lazily freed page discarded, where a page the kernel has
/// isolated for a moment (compaction, migration) is skipped by that one MADV_PAGEOUT. Returns
/// the pages still resident (0 unless something keeps them).
pub fn force_purge_all(ptr: *mut u8, len: usize) -> usize {
    let mut resident = usize::MAX;
    for _ in 0..50 {
        force_purge(ptr, len);
        resident = mem::resident_pages(ptr, len).expect("mincore");
        if resident == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    resident
}

/// Pins the calling thread to the CPU it runs on (once per thread), so that MADV_FREE and
/// MADV_PAGEOUT share a CPU and forced purges are deterministic (see
/// `vrange_sys::mem::reclaim_now`). Mappings made by the helpers below call it first.
pub fn pin_cpu() {
    thread_local!(static PINNED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) });
    if PINNED.with(|p| p.replace(true)) {
        return;
    }
    mem::pin_thread_to_current_cpu().expect("pin the test thread to its CPU");
}

/// A private anonymous mapping owned by a test, unmapped on drop.
pub struct Mapping {
    pub ptr: *mut u8,
    pub len: usize,
}

impl Mapping {
    pub fn new(len: usize) -> Mapping {
        Mapping::aligned(len, mem::page_size(), false)
    }

    pub fn aligned(len: usize, align: usize, huge: bool) -> Mapping {
        pin_cpu();
        let ptr = mem::map_anon(len, align).expect("mmap").as_ptr();
        mem::advise_huge(ptr, len, huge).ok();
        Mapping { ptr, len }
    }

    pub fn page(&self, i: usize) -> *mut u8 {
        self.ptr.wrapping_add(i * mem::page_size())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // Memory unmapped while volatile must be forgotten, or a later mapping at the same
        // address would inherit its page states.
        // SAFETY: test-owned memory; the mapping is owned by this value and about to go.
        unsafe { vrange::forget(self.ptr, self.len).unwrap() };
        // SAFETY: test-owned memory; the mapping is owned by this value.
        unsafe { mem::unmap(std::ptr::NonNull::new(self.ptr).unwrap(), self.len) };
    }
}

/// Only explicit purges (and the ones a test enables) from here on: the pressure sources and
/// the budget off, hybrid ranges not armed for an hour.
pub fn quiet() {
    for (name, value) in [
        ("VRANGE_PSI", "off"),
        ("VRANGE_VMPRESSURE", "off"),
        ("VRANGE_HEADROOM", "off"),
        ("VRANGE_BUDGET", "0"),
        ("VRANGE_ARM_DELAY_MS", "3600000"),
        ("VRANGE_POLL_MS", "100"),
    ] {
        vrange::set_option(name, value).unwrap();
    }
}

/// Writes the words of the pattern with `seed` at `offset` (bytes, a multiple of 8) into `buf`:
/// a refill region's generator.
pub fn generate(seed: u64, offset: usize, buf: &mut [u8]) {
    for (j, chunk) in buf.chunks_exact_mut(8).enumerate() {
        chunk
            .copy_from_slice(&vrange_testkit::pattern::pattern(seed, offset / 8 + j).to_ne_bytes());
    }
}

/// A small deterministic generator of offsets (xorshift; no dependency for a test's dice).
pub fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Closes every descriptor at or above vrange's floor, as a daemon's closefrom would: the
/// program taking vrange's descriptors away.
pub fn close_from_floor() {
    // SAFETY: close_range on descriptors this test process does not use itself (vrange's, at
    // and above the floor).
    #[allow(clippy::disallowed_methods)]
    let rc = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            vrange_sys::fd::floor() as libc::c_uint,
            libc::c_uint::MAX,
            0,
        )
    };
    assert_eq!(rc, 0, "close_range");
}

/// Word `i` of a refill region, read through it (a missing block is filled first).
pub fn read_word(r: &vrange::RefillRegion, i: usize) -> u64 {
    assert!(i * 8 < r.len());
    // SAFETY: inside the region; reading fills its block first if it is missing.
    unsafe { (r.as_ptr() as *const u64).add(i).read_volatile() }
}

/// A refill region just made, or None (with a printed reason, a skip) where userfaultfd is not
/// available to this process.
pub fn refill_or_skip(
    made: Result<vrange::RefillRegion, vrange::Error>,
) -> Option<vrange::RefillRegion> {
    match made {
        Ok(r) => Some(r),
        Err(vrange::Error::Os(libc::ENOTSUP)) => {
            vrange_testkit::skip("userfaultfd is not available to this process");
            None
        }
        Err(e) => panic!("a refill region: {e}"),
    }
}

/// The closed-descriptor scenario of both refill kinds: region `a` (seed 11, `make(seed)` gives
/// a region of at least two blocks of `block` bytes holding `pattern(seed, _)`) is read, the
/// program closes every descriptor from vrange's floor up (the kernel drops the registrations),
/// region `b` (seed 12) opens a new descriptor, and then `a`'s purged block must be made again
/// within `within` (zero: at once). Until `a` is registered again, a missing page of it reads
/// zero, so the block is taken and read again every 100 ms until the deadline.
pub fn registered_again_after_closefrom(
    block: usize,
    make: impl Fn(u64) -> Option<vrange::RefillRegion>,
    within: std::time::Duration,
) {
    use vrange_testkit::pattern::pattern;
    let Some(a) = make(11) else {
        return;
    };
    assert_eq!(read_word(&a, 0), pattern(11, 0));
    close_from_floor();
    let Some(b) = make(12) else {
        return;
    };
    assert_eq!(read_word(&b, 1), pattern(12, 1));
    let deadline = std::time::Instant::now() + within;
    loop {
        // SAFETY: the region's content is the generator's: nothing is lost.
        unsafe { mem::purge_forced(a.as_ptr(), block) }.unwrap();
        if read_word(&a, 1) == pattern(11, 1) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the first region was not registered again within {within:?}: its pages read zero"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Both refill kinds refuse a block that is not a page multiple and a zero length;
/// `make(len, block)` makes a region of the kind.
pub fn refill_refuses_bad_arguments(
    make: impl Fn(usize, usize) -> Result<vrange::RefillRegion, vrange::Error>,
) {
    let page = vrange::page_size();
    assert_eq!(
        make(16 * page, page + 1).err(),
        Some(vrange::Error::Unaligned)
    );
    assert_eq!(make(0, page).err(), Some(vrange::Error::NotRegion));
}
