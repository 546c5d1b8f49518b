//! Kernels before 6.11 lack PROCMAP_QUERY: range checks then parse /proc/self/maps through a
//! stack buffer. This binary forces that path for every test in it and checks the same answers.

mod common;
use common::{force_purge, Mapping};
use vrange::{mark_volatile, page_size, unmark, Error};
use vrange_sys::vma::force_parsing_fallback;
use vrange_testkit::pattern::{check_at, fill};

#[test]
fn parsing_fallback_gives_the_same_answers() {
    force_parsing_fallback(true);
    let page = page_size();
    let m = Mapping::new(16 * page);
    fill(m.ptr, m.len, 40);
    // SAFETY: test-owned memory.
    unsafe { mark_volatile(m.ptr, m.len).unwrap() };
    force_purge(m.page(3), 2 * page);
    // SAFETY: test-owned memory.
    let r = unsafe { unmark(m.ptr, m.len).unwrap() };
    assert_eq!((r.volatile, r.purged), (16, 2));
    assert!(check_at(m.ptr, 5 * page, 11 * page, 40));

    let tail = Mapping::new(2 * page);
    // SAFETY: test-owned memory; leaves a hole after the first page.
    unsafe { vrange_sys::mem::unmap(std::ptr::NonNull::new(tail.page(1)).unwrap(), page) };
    // SAFETY: each call must fail before touching anything.
    let (hole, null, text) = unsafe {
        let text = parsing_fallback_gives_the_same_answers as *const () as usize & !(page - 1);
        (
            mark_volatile(tail.ptr, 2 * page),
            unmark(std::ptr::null_mut(), page).map(|_| ()),
            // A text page of this executable: file-backed.
            mark_volatile(text as *mut u8, page),
        )
    };
    assert_eq!(hole, Err(Error::NotMapped));
    assert_eq!(null, Err(Error::NotMapped));
    assert_eq!(text, Err(Error::Unsupported));
}
