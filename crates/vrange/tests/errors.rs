//! Bad input gets madvise(2)'s errno and changes nothing.

mod common;
use common::{force_purge, Mapping};
use vrange::{mark_volatile, page_size, unmark, volatile_pages, Error};
use vrange_sys::mem;
use vrange_testkit::pattern::{check, check_at, fill, is_zero};
use vrange_testkit::serial;

fn both(ptr: *mut u8, len: usize) -> (Result<usize, Error>, Result<vrange::Unmarked, Error>) {
    // SAFETY: test-owned memory; the calls must fail before touching anything.
    unsafe { (mark_volatile(ptr, len), unmark(ptr, len)) }
}

fn raw_map(len: usize, prot: i32, flags: i32, fd: i32) -> *mut u8 {
    // SAFETY: test-owned memory; a fresh mapping.
    #[allow(clippy::disallowed_methods)]
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, 0) };
    assert_ne!(p, libc::MAP_FAILED);
    p.cast()
}

#[test]
fn errno_table() {
    // A hole left by munmap is refilled by the next mmap of any thread: tests here take turns.
    let _serial = serial();
    let page = page_size();
    let m = Mapping::new(4 * page);
    let tail = Mapping::new(2 * page);
    // SAFETY: test-owned memory; unmapping the last page of our own mapping leaves a hole after it.
    unsafe { mem::unmap(std::ptr::NonNull::new(tail.page(1)).unwrap(), page) };
    let cases: Vec<(&str, *mut u8, usize, Error, i32)> = vec![
        (
            "unaligned start",
            m.ptr.wrapping_add(1),
            page,
            Error::Unaligned,
            libc::EINVAL,
        ),
        (
            "overflowing length",
            m.ptr,
            usize::MAX - 10,
            Error::Overflow,
            libc::EINVAL,
        ),
        (
            "end past the address space",
            (usize::MAX & !(page - 1)) as *mut u8,
            page,
            Error::Overflow,
            libc::EINVAL,
        ),
        (
            "above tracked addresses",
            (1usize << 48) as *mut u8,
            page,
            Error::OutOfReach,
            libc::EINVAL,
        ),
        (
            "past the end of a mapping",
            tail.ptr,
            2 * page,
            Error::NotMapped,
            libc::ENOMEM,
        ),
        (
            "null page",
            std::ptr::null_mut(),
            page,
            Error::NotMapped,
            libc::ENOMEM,
        ),
    ];
    for (what, ptr, len, want, errno) in cases {
        let (a, b) = both(ptr, len);
        assert_eq!(a, Err(want), "mark: {what}");
        assert_eq!(b.map(|_| ()), Err(want), "unmark: {what}");
        assert_eq!(want.errno(), errno, "{what}");
    }
}

#[test]
fn holes_shared_file_and_protected_memory_are_refused() {
    // A hole left by munmap is refilled by the next mmap of any thread: tests here take turns.
    let _serial = serial();
    let page = page_size();
    let hole = Mapping::new(3 * page);
    // SAFETY: test-owned memory; punching a hole in our own mapping.
    unsafe { mem::unmap(std::ptr::NonNull::new(hole.page(1)).unwrap(), page) };
    assert_eq!(both(hole.ptr, 3 * page).0, Err(Error::NotMapped));

    let shared = raw_map(
        page,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_SHARED | libc::MAP_ANONYMOUS,
        -1,
    );
    let readonly = raw_map(
        page,
        libc::PROT_READ,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
        -1,
    );
    let none = raw_map(
        page,
        libc::PROT_NONE,
        libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
        -1,
    );
    let file = std::fs::File::open("/proc/self/exe").unwrap();
    use std::os::fd::AsRawFd;
    let filemap = raw_map(
        page,
        libc::PROT_READ | libc::PROT_WRITE,
        libc::MAP_PRIVATE,
        file.as_raw_fd(),
    );
    for (what, ptr) in [
        ("shared", shared),
        ("read-only", readonly),
        ("PROT_NONE", none),
        ("file-backed", filemap),
    ] {
        let (a, b) = both(ptr, page);
        assert_eq!(a, Err(Error::Unsupported), "mark {what}");
        assert_eq!(b.map(|_| ()), Err(Error::Unsupported), "unmark {what}");
    }
}

#[test]
fn locked_memory_is_refused_and_left_pinned() {
    let _serial = serial();
    let page = page_size();
    let m = Mapping::new(8 * page);
    fill(m.ptr, m.len, 20);
    // SAFETY: test-owned memory; locking our own mapping.
    if unsafe { libc::mlock(m.page(4).cast(), 4 * page) } != 0 {
        vrange_testkit::skip(format_args!(
            "mlock failed: {}",
            std::io::Error::last_os_error()
        ));
        return;
    }
    // SAFETY: test-owned memory; ours.
    let r = unsafe { mark_volatile(m.ptr, m.len) };
    assert_eq!(r, Err(Error::Refused));
    assert_eq!(Error::Refused.errno(), libc::EINVAL);
    assert_eq!(
        volatile_pages(m.ptr, m.len).unwrap(),
        0,
        "nothing stays marked"
    );
    force_purge(m.ptr, 4 * page);
    assert!(check(m.ptr, m.len, 20), "nothing was lost");
    // SAFETY: test-owned memory; ours.
    unsafe { libc::munlock(m.page(4).cast(), 4 * page) };
}

#[test]
fn regression_refused_mark_keeps_an_earlier_purge() {
    let _serial = serial();
    // A page purged while volatile, then a larger mark refused because of a locked page: the
    // clean-up pin must not forget the loss.
    let page = page_size();
    let m = Mapping::new(8 * page);
    fill(m.ptr, m.len, 21);
    // SAFETY: test-owned memory; ours.
    unsafe { mark_volatile(m.ptr, 2 * page).unwrap() };
    force_purge(m.ptr, page);
    // SAFETY: test-owned memory; locking our own mapping.
    if unsafe { libc::mlock(m.page(6).cast(), page) } != 0 {
        vrange_testkit::skip(format_args!(
            "mlock failed: {}",
            std::io::Error::last_os_error()
        ));
        return;
    }
    // SAFETY: test-owned memory; ours.
    assert_eq!(unsafe { mark_volatile(m.ptr, m.len) }, Err(Error::Refused));
    // SAFETY: test-owned memory; ours.
    let r = unsafe { unmark(m.ptr, m.len).unwrap() };
    assert_eq!(
        r.purged, 1,
        "the purge before the refused mark is still reported"
    );
    assert!(is_zero(m.ptr, page));
    assert!(check_at(m.ptr, page, 7 * page, 21));
    // SAFETY: test-owned memory; ours.
    unsafe { libc::munlock(m.page(6).cast(), page) };
}

/// The zero-length rule at the end of the tracked range, as vrange.h documents it: the empty
/// range at 2^48 is accepted (it lies within the tracked range's end), one a page above is not.
#[test]
fn zero_length_at_the_tracked_boundary() {
    let _serial = serial();
    let top = (1usize << 48) as *mut u8;
    // SAFETY: a zero-length call touches no memory.
    assert_eq!(unsafe { vrange::mark_volatile(top, 0) }, Ok(0));
    // SAFETY: as above.
    let r = unsafe { vrange::unmark(top, 0) };
    assert_eq!(r, Ok(vrange::Unmarked::default()));
    let above = top.wrapping_add(page_size());
    // SAFETY: as above.
    let r = unsafe { vrange::mark_volatile(above, 0) };
    assert_eq!(r, Err(Error::OutOfReach));
    assert_eq!(Error::OutOfReach.errno(), libc::EINVAL);
}
