//! Refill regions filled on the faulting thread (opt-in: [`crate::RefillRegion::filled_here`],
//! C `VRANGE_FILL_HERE`). The region is registered in MISSING mode on the process's SIGBUS-mode
//! userfaultfd (`crate::sigbus`), so a touch of a missing page raises SIGBUS on the touching
//! thread itself; vrange's SIGBUS handler (`vrange_sys::process::hook_sigbus`, installed by the
//! first such region, in front of the program's action) finds the region, calls its fill
//! function there with a buffer of the region's, installs the block (`UFFDIO_COPY`, pages
//! present meanwhile kept), hands it to the lazy-free path and returns: the access is retried
//! and succeeds. No other thread wakes: a fault costs the signal's delivery and return, the
//! fill and the install. A SIGBUS at any other address, and one whose fill fails, goes to the
//! program's own action (its handler may place the page with [`crate::fill`] and return).
//!
//! Each region's entry in the region table (`crate::regions`) keeps a [`Here`]: its block, fill
//! function and fill buffers. The handler finds the region by one lock-free lookup there and is
//! counted inside it while it fills; removing a region unpublishes it and waits until no
//! handler is inside before its fill function is dropped. Each region keeps up to [`BUFFERS`]
//! fill buffers, mapped at first need (mmap is async-signal-safe) and claimed by swapping them
//! out of their cell; when all are in use a fault maps one of its own and unmaps it after.
//!
//! Differences from the refill thread's regions: the fill function runs on the touching thread,
//! inside its SIGBUS handler, several at once (it must be `Sync`, must not touch a refill
//! region, and may allocate or lock only what the touching code does not hold at that
//! instant); and a fill does not first give back the region's oldest blocks near the
//! cgroup's limit (that needs the headroom read and a list of blocks: the kernel's reclaim
//! takes the lazy-free blocks instead).

use crate::extents::Kind;
use crate::regions;
use crate::Error;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::{null_mut, NonNull};
use std::sync::atomic::AtomicPtr;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use vrange_sys::{mem, uffd};

/// A fill function called on faulting threads, several at once.
pub(crate) type SharedFill = Box<dyn Fn(usize, &mut [u8]) -> bool + Send + Sync>;

/// Fill buffers a region keeps (faults filled at once beyond this map their own).
const BUFFERS: usize = 4;

/// What a region filled on the faulting thread keeps, in its region table entry.
struct Here {
    block: usize,
    fill: SharedFill,
    /// Kept fill buffers of `block` bytes (null: none kept there, or claimed).
    buffers: [AtomicPtr<u8>; BUFFERS],
}

/// Publishes a region (mapped and registered by the caller) with its fill function.
/// `Error::Os(ENOMEM)` when the region table is full.
pub(crate) fn add(start: usize, len: usize, block: usize, fill: SharedFill) -> Result<(), Error> {
    let here = Box::into_raw(Box::new(Here {
        block,
        fill,
        buffers: [const { AtomicPtr::new(null_mut()) }; BUFFERS],
    }));
    regions::record(Kind::RefillHere, start, len, here.cast()).inspect_err(|_| {
        // SAFETY: from `Box::into_raw` just above, never published.
        drop(unsafe { Box::from_raw(here) });
    })
}

/// Unpublishes the region at `start..start + len`, waits for the handlers inside it, unmaps its
/// buffers, and returns its fill function (to be dropped outside any lock). None if no such
/// region is published.
pub(crate) fn remove(start: usize, len: usize) -> Option<SharedFill> {
    let here = regions::remove(Kind::RefillHere, start, len)?.cast::<Here>();
    // SAFETY: recorded by `add` from `Box::into_raw`; no handler is inside the region any more.
    let here = unsafe { Box::from_raw(here) };
    for b in &here.buffers {
        if let Some(p) = NonNull::new(b.swap(null_mut(), Relaxed)) {
            // SAFETY: a buffer this region mapped, claimed by no handler (none is inside).
            unsafe { mem::unmap(p, here.block) };
        }
    }
    Some(here.fill)
}

/// Calls `f(start, len)` for every published region (a new SIGBUS descriptor registers them).
pub(crate) fn for_each(f: impl FnMut(usize, usize)) {
    regions::each(Kind::RefillHere, f);
}

/// For the SIGBUS hook (`crate::refill`'s, which passes the SIGBUS-mode descriptor `fd`):
/// fills the block holding `addr` if a region filled on the faulting thread holds it.
/// Async-signal-safe but for the fill function itself.
pub(crate) fn resolve(fd: i32, addr: usize) -> bool {
    let Some(inside) = regions::enter(addr) else {
        return false;
    };
    if inside.entry.kind() != Some(Kind::RefillHere) {
        return false;
    }
    // SAFETY: recorded by `add` as a `Here`, which lives until `remove` has waited for every
    // handler inside the region (this one is, until `inside` drops).
    let here = unsafe { &*inside.entry.state().cast::<Here>() };
    serve(here, fd, inside.start, inside.len, addr)
}

/// Fills and installs the block of the region holding `addr` (registered on `fd`); whether it
/// is in place now.
fn serve(here: &Here, fd: i32, start: usize, len: usize, addr: usize) -> bool {
    let block = here.block;
    let offset = (addr - start) / block * block;
    let n = block.min(len - offset);
    let Some(buf) = claim(here) else {
        crate::stats::count_refill_failure();
        return false;
    };
    // SAFETY: `buf` is a mapping of `block` >= `n` bytes that this handler alone holds.
    let out = unsafe { std::slice::from_raw_parts_mut(buf.as_ptr(), n) };
    let ok = catch_unwind(AssertUnwindSafe(|| (here.fill)(offset, out))).unwrap_or(false);
    let dst = start + offset;
    // SAFETY: `buf` holds `n` bytes; `dst..dst + n` lies in the region, registered on `fd`.
    let installed = ok && unsafe { uffd::copy(fd, dst, buf.as_ptr(), n) }.is_ok();
    release(here, buf);
    if installed {
        crate::stats::count_refill(n);
        // Clean lazy pages: the first the kernel drops when memory is short.
        // SAFETY: the block's content is the fill's, made again at the next fault.
        let _ = unsafe { mem::purge_lazy(dst as *mut u8, n) };
    } else {
        // The fill failed, or its block could not be installed (ENOMEM): the fault goes on
        // to the program's action, counted as the refill thread counts it.
        crate::stats::count_refill_failure();
    }
    installed
}

/// A fill buffer of the region's block: one it keeps, or a new mapping.
fn claim(here: &Here) -> Option<NonNull<u8>> {
    for b in &here.buffers {
        if let Some(p) = NonNull::new(b.swap(null_mut(), Acquire)) {
            return Some(p);
        }
    }
    mem::map_anon(here.block, mem::page_size()).ok()
}

/// Gives `buf` back to the region's kept buffers, or unmaps it when they are all kept.
fn release(here: &Here, buf: NonNull<u8>) {
    for b in &here.buffers {
        if b.compare_exchange(null_mut(), buf.as_ptr(), Release, Relaxed)
            .is_ok()
        {
            return;
        }
    }
    // SAFETY: a buffer mapped by `claim`, held by this handler alone.
    unsafe { mem::unmap(buf, here.block) };
}
