//! `libvrange_malloc.so`: vrange-malloc for any program, by `LD_PRELOAD`.
//!
//! Interposes malloc, free, calloc, realloc, reallocarray, memalign, posix_memalign,
//! aligned_alloc, valloc, pvalloc and malloc_usable_size. Requests at or above
//! `VRANGE_MALLOC_THRESHOLD` (64 KiB by default) are served from volatile free memory; smaller
//! ones, and every pointer the allocator did not hand out, go to glibc's `__libc_*` functions.
//!
//! Safe before the Rust runtime exists (nothing here needs it), before and without thread-local
//! storage (arenas are chosen by CPU), in fork children (fork handlers hold every allocator
//! lock across the fork) and on threads created by any library. Errors follow the C contracts:
//! null with `errno` ENOMEM (or EINVAL for a bad alignment), and a failed realloc leaves the
//! old block intact. An internal invariant violation aborts the process (as glibc's malloc does
//! on heap corruption); nothing unwinds into C.

#![deny(unsafe_op_in_unsafe_fn)]
#![allow(clippy::missing_safety_doc)] // the C contracts of malloc(3) apply

use engine::heap;
use libc::{c_int, c_void, size_t};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

extern "C" {
    fn __libc_malloc(size: size_t) -> *mut c_void;
    fn __libc_free(ptr: *mut c_void);
    fn __libc_calloc(n: size_t, size: size_t) -> *mut c_void;
    fn __libc_realloc(ptr: *mut c_void, size: size_t) -> *mut c_void;
    fn __libc_memalign(align: size_t, size: size_t) -> *mut c_void;
    fn __libc_valloc(size: size_t) -> *mut c_void;
    fn __libc_pvalloc(size: size_t) -> *mut c_void;
}

/// malloc's alignment guarantee on x86-64 and arm64.
const MALLOC_ALIGN: usize = 16;

// Every entry point lives in `.text.hot.vrange_malloc`, which `hot.ld` places with the rest
// of what a program runs when the shim serves none of its blocks (the settings read at load,
// the foreign-pointer lookup) ahead of the text: one page-in window of the file (the kernel
// maps 64 KiB around a fault) holds it, rather than one window per function.

/// glibc's own malloc_usable_size, found once at load time.
static LIBC_USABLE: AtomicUsize = AtomicUsize::new(0);

#[link_section = ".text.hot.vrange_malloc"]
extern "C" fn on_load() {
    heap::read_settings();
    // SAFETY: dlsym with RTLD_NEXT and a NUL-terminated name; its few small allocations go to
    // glibc (below the threshold).
    let f = unsafe { libc::dlsym(libc::RTLD_NEXT, c"malloc_usable_size".as_ptr()) };
    LIBC_USABLE.store(f as usize, Relaxed);
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

fn ours(size: usize, align: usize) -> Option<heap::Block> {
    heap::alloc(size, align)
}

#[no_mangle]
#[link_section = ".text.hot.vrange_malloc"]
pub unsafe extern "C" fn malloc(size: size_t) -> *mut c_void {
    if !heap::may_serve(size) {
        // Most requests: declined with one comparison and a jump, no register saved.
        // SAFETY: glibc's malloc, same contract.
        return unsafe { __libc_malloc(size) };
    }
    malloc_at_threshold(size)
}

/// `malloc` of a request at or above the threshold: out of line, so that `malloc` of the rest
/// saves no register. `extern "C"` (which cannot unwind: a panic inside aborts) so that
/// `malloc` needs no unwinding pad around the call and can jump to it as its last act.
#[inline(never)]
extern "C" fn malloc_at_threshold(size: size_t) -> *mut c_void {
    match ours(size, MALLOC_ALIGN) {
        Some(b) => b.ptr.as_ptr().cast(),
        // SAFETY: glibc's malloc, same contract.
        None => unsafe { __libc_malloc(size) },
    }
}

#[no_mangle]
#[link_section = ".text.hot.vrange_malloc"]
pub unsafe extern "C" fn free(ptr: *mut c_void) {
    if heap::owns(ptr.cast()) {
        // SAFETY: the caller frees a live block of ours once.
        unsafe { free_ours(ptr) }
    } else {
        // Most calls: a lookup and a jump, no register saved. (Null is nobody's block; glibc's
        // free ignores it.)
        // SAFETY: not ours, so glibc's (or null).
        unsafe { __libc_free(ptr) }
    }
}

/// `free` of the allocator's own block, out of line (see `malloc_at_threshold`).
///
/// # Safety
/// `ptr` is a live block of the allocator's, freed once.
#[inline(never)]
unsafe extern "C" fn free_ours(ptr: *mut c_void) {
    // SAFETY: as the caller promises.
    unsafe { heap::free(ptr.cast()) };
}

#[no_mangle]
#[link_section = ".text.hot.vrange_malloc"]
pub unsafe extern "C" fn calloc(n: size_t, size: size_t) -> *mut c_void {
    match n.checked_mul(size) {
        Some(total) if heap::may_serve(total) => calloc_at_threshold(total),
        // Most calls, and an overflowing product (glibc's calloc fails it with ENOMEM):
        // SAFETY: glibc's calloc, same contract.
        _ => unsafe { __libc_calloc(n, size) },
    }
}

/// `calloc` of `total` bytes at or above the threshold, out of line (see `malloc_at_threshold`).
#[inline(never)]
extern "C" fn calloc_at_threshold(total: size_t) -> *mut c_void {
    match ours(total, MALLOC_ALIGN) {
        Some(b) => {
            if !b.zeroed {
                // SAFETY: the block has at least `total` writable bytes.
                unsafe { b.ptr.as_ptr().write_bytes(0, total) };
            }
            b.ptr.as_ptr().cast()
        }
        // SAFETY: glibc's calloc, same contract (1 × total cannot overflow).
        None => unsafe { __libc_calloc(1, total) },
    }
}

fn libc_usable(ptr: *mut c_void) -> usize {
    match LIBC_USABLE.load(Relaxed) {
        0 => 0,
        f => {
            // SAFETY: the address dlsym returned for malloc_usable_size.
            let f: unsafe extern "C" fn(*mut c_void) -> size_t = unsafe { std::mem::transmute(f) };
            // SAFETY: ptr is a live glibc block.
            unsafe { f(ptr) }
        }
    }
}

#[no_mangle]
#[link_section = ".text.hot.vrange_malloc"]
pub unsafe extern "C" fn realloc(ptr: *mut c_void, size: size_t) -> *mut c_void {
    if !heap::owns(ptr.cast()) && !heap::may_serve(size) {
        // Most calls: glibc's block (or null) staying below the threshold.
        // SAFETY: glibc's block (or null) and glibc's realloc.
        return unsafe { __libc_realloc(ptr, size) };
    }
    // SAFETY: as the caller promises.
    unsafe { realloc_either(ptr, size) }
}

/// `realloc` where the block is ours or the new size may be ours, out of line (see
/// `malloc_at_threshold`).
///
/// # Safety
/// realloc(3)'s contract.
#[inline(never)]
unsafe extern "C" fn realloc_either(ptr: *mut c_void, size: size_t) -> *mut c_void {
    if ptr.is_null() {
        // SAFETY: malloc's contract.
        return unsafe { malloc(size) };
    }
    if let Some(usable) = heap::usable_size(ptr.cast()) {
        if size == 0 {
            // SAFETY: a live block of ours (glibc frees and returns null for size 0 too).
            unsafe { free(ptr) };
            return std::ptr::null_mut();
        }
        // SAFETY: a live block of ours.
        if unsafe { heap::resize_in_place(ptr.cast(), size) } {
            return ptr;
        }
        // SAFETY: malloc's contract.
        let new = unsafe { malloc(size) };
        if !new.is_null() {
            // SAFETY: both live and disjoint; each holds at least the bytes copied.
            unsafe {
                std::ptr::copy_nonoverlapping(ptr.cast::<u8>(), new.cast(), usable.min(size))
            };
            // SAFETY: the old block is no longer used.
            unsafe { free(ptr) };
        }
        return new;
    }
    if heap::serves(size, MALLOC_ALIGN) {
        let old = libc_usable(ptr);
        if old != 0 {
            if let Some(b) = ours(size, MALLOC_ALIGN) {
                // SAFETY: both live and disjoint; each holds at least the bytes copied.
                unsafe {
                    std::ptr::copy_nonoverlapping(ptr.cast::<u8>(), b.ptr.as_ptr(), old.min(size))
                };
                // SAFETY: glibc's block, no longer used.
                unsafe { __libc_free(ptr) };
                return b.ptr.as_ptr().cast();
            }
        }
    }
    // SAFETY: glibc's block and glibc's realloc.
    unsafe { __libc_realloc(ptr, size) }
}

#[no_mangle]
#[link_section = ".text.hot.vrange_malloc"]
pub unsafe extern "C" fn reallocarray(ptr: *mut c_void, n: size_t, size: size_t) -> *mut c_void {
    match n.checked_mul(size) {
        // SAFETY: realloc's contract.
        Some(total) => unsafe { realloc(ptr, total) },
        None => {
            set_errno(libc::ENOMEM);
            std::ptr::null_mut()
        }
    }
}

/// An aligned allocation; `align` is a power of two.
unsafe fn aligned(align: size_t, size: size_t) -> *mut c_void {
    match ours(size, align.max(MALLOC_ALIGN)) {
        Some(b) => b.ptr.as_ptr().cast(),
        // SAFETY: glibc's memalign, same contract.
        None => unsafe { __libc_memalign(align, size) },
    }
}

#[no_mangle]
#[link_section = ".text.hot.vrange_malloc"]
pub unsafe extern "C" fn memalign(align: size_t, size: size_t) -> *mut c_void {
    if !align.is_power_of_two() {
        // glibc rounds such alignments up; so does its memalign, which gets them.
        // SAFETY: glibc's memalign, same contract.
        return unsafe { __libc_memalign(align, size) };
    }
    // SAFETY: align is a power of two.
    unsafe { aligned(align, size) }
}

#[no_mangle]
#[link_section = ".text.hot.vrange_malloc"]
pub unsafe extern "C" fn aligned_alloc(align: size_t, size: size_t) -> *mut c_void {
    if !align.is_power_of_two() {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    // SAFETY: align is a power of two.
    unsafe { aligned(align, size) }
}

#[no_mangle]
#[link_section = ".text.hot.vrange_malloc"]
pub unsafe extern "C" fn posix_memalign(
    out: *mut *mut c_void,
    align: size_t,
    size: size_t,
) -> c_int {
    if !align.is_power_of_two() || align % std::mem::size_of::<*mut c_void>() != 0 {
        return libc::EINVAL;
    }
    // SAFETY: align is a power of two.
    let p = unsafe { aligned(align, size) };
    if p.is_null() && size != 0 {
        return libc::ENOMEM;
    }
    // SAFETY: the caller passes a valid out pointer.
    unsafe { *out = p };
    0
}

#[no_mangle]
#[link_section = ".text.hot.vrange_malloc"]
pub unsafe extern "C" fn valloc(size: size_t) -> *mut c_void {
    match ours(size, engine_page()) {
        Some(b) => b.ptr.as_ptr().cast(),
        // SAFETY: glibc's valloc, same contract.
        None => unsafe { __libc_valloc(size) },
    }
}

#[no_mangle]
#[link_section = ".text.hot.vrange_malloc"]
pub unsafe extern "C" fn pvalloc(size: size_t) -> *mut c_void {
    let page = engine_page();
    let Some(rounded) = size.checked_add(page - 1).map(|s| s & !(page - 1)) else {
        set_errno(libc::ENOMEM);
        return std::ptr::null_mut();
    };
    match ours(rounded.max(page), page) {
        Some(b) => b.ptr.as_ptr().cast(),
        // SAFETY: glibc's pvalloc, same contract.
        None => unsafe { __libc_pvalloc(size) },
    }
}

#[no_mangle]
#[link_section = ".text.hot.vrange_malloc"]
pub unsafe extern "C" fn malloc_usable_size(ptr: *mut c_void) -> size_t {
    if ptr.is_null() {
        return 0;
    }
    heap::usable_size(ptr.cast()).unwrap_or_else(|| libc_usable(ptr))
}

fn engine_page() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

// The unwinder (what the standard library's panics and backtraces call) linked into the shim
// from GCC's static libgcc_eh, ahead of the libgcc_s.so the standard library asks for, which
// is then not loaded at all: a program preloading the shim maps no 100 kB of libgcc_s it did
// not map before. The shim's entry points never let a panic out (nothing unwinds into C), so
// its unwinder never meets the program's.
#[link(name = "gcc_eh", kind = "static")]
extern "C" {}
