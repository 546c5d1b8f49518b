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
//! The table is fixed, of atomics, and read without a lock by the handler: a region's entry is
//! published (`len` last) after its fill and block are, and removed by clearing `len`, then
//! waiting until no handler is inside it (`users`), before its fill function is dropped.
//! Creating and removing entries take the table's lock, which fork holds (a child drops the
//! parent's handlers in flight). Each region keeps up to [`BUFFERS`] fill buffers, mapped at
//! first need (mmap is async-signal-safe) and claimed by swapping them out of their cell;
//! when all are in use a fault maps one of its own and unmaps it after.
//!
//! Differences from the refill thread's regions: the fill function runs on the touching thread,
//! inside its SIGBUS handler, several at once (it must be `Sync`, must not touch a refill
//! region, and may allocate or lock only what the touching code does not hold at that
//! instant); and a fill does not first give back the region's oldest blocks near the
//! cgroup's limit (that needs the headroom read and a list of blocks: the kernel's reclaim
//! takes the lazy-free blocks instead).

use crate::lock::{Lock, Rank};
use crate::Error;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::{null_mut, NonNull};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicPtr, AtomicUsize};
use vrange_sys::{mem, uffd};

/// A fill function called on faulting threads, several at once.
pub(crate) type SharedFill = Box<dyn Fn(usize, &mut [u8]) -> bool + Send + Sync>;

/// Regions filled on the faulting thread that may live at once.
const ENTRIES: usize = 64;
/// Fill buffers a region keeps (faults filled at once beyond this map their own).
const BUFFERS: usize = 4;

struct Entry {
    /// The region's start; 0 when the entry is free.
    start: AtomicUsize,
    /// Its length; 0 while the entry is not (or no longer) published.
    len: AtomicUsize,
    block: AtomicUsize,
    /// `Box::into_raw` of the region's `SharedFill`.
    fill: AtomicPtr<SharedFill>,
    /// Handlers inside this entry.
    users: AtomicUsize,
    /// Kept fill buffers of `block` bytes (null: none kept there, or claimed).
    buffers: [AtomicPtr<u8>; BUFFERS],
}

#[allow(clippy::declare_interior_mutable_const)] // only to initialise the table below
const NO_BUFFER: AtomicPtr<u8> = AtomicPtr::new(null_mut());
#[allow(clippy::declare_interior_mutable_const)] // only to initialise the table below
const EMPTY: Entry = Entry {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    block: AtomicUsize::new(0),
    fill: AtomicPtr::new(null_mut()),
    users: AtomicUsize::new(0),
    buffers: [NO_BUFFER; BUFFERS],
};
static TABLE: [Entry; ENTRIES] = [EMPTY; ENTRIES];
/// Taken to add and remove entries; held across fork (`crate::fork`).
pub(crate) static LOCK: Lock = Lock::new(Rank::RefillHere);

/// Publishes a region (mapped and registered by the caller) with its fill function.
/// `Error::Os(ENOMEM)` when [`ENTRIES`] regions live already.
pub(crate) fn add(start: usize, len: usize, block: usize, fill: SharedFill) -> Result<(), Error> {
    let _held = LOCK.lock();
    let e = TABLE
        .iter()
        .find(|e| e.start.load(Relaxed) == 0)
        .ok_or(Error::Os(libc::ENOMEM))?;
    e.start.store(start, Relaxed);
    e.block.store(block, Relaxed);
    e.fill.store(Box::into_raw(Box::new(fill)), Relaxed);
    e.len.store(len, Release);
    Ok(())
}

/// Unpublishes the region at `start..start + len`, waits for the handlers inside it, unmaps its
/// buffers, and returns its fill function (to be dropped outside any lock). None if no such
/// region is published.
pub(crate) fn remove(start: usize, len: usize) -> Option<SharedFill> {
    let _held = LOCK.lock();
    let e = TABLE
        .iter()
        .find(|e| e.start.load(Relaxed) == start && e.len.load(Relaxed) == len)?;
    // SeqCst with the handlers' increment and check (`enter`): either a handler sees the
    // cleared length and leaves, or this sees its increment and waits.
    e.len.store(0, SeqCst);
    while e.users.load(SeqCst) != 0 {
        std::thread::yield_now();
    }
    let block = e.block.load(Relaxed);
    for b in &e.buffers {
        if let Some(p) = NonNull::new(b.swap(null_mut(), Relaxed)) {
            // SAFETY: a buffer this entry mapped, claimed by no handler (none is inside).
            unsafe { mem::unmap(p, block) };
        }
    }
    let fill = e.fill.swap(null_mut(), Relaxed);
    e.start.store(0, Release);
    // SAFETY: from `Box::into_raw` in `add`; no handler uses it any more.
    Some(unsafe { *Box::from_raw(fill) })
}

/// Whether `start..start + len` is exactly a published region.
pub(crate) fn is_exactly(start: usize, len: usize) -> bool {
    TABLE
        .iter()
        .any(|e| e.start.load(Acquire) == start && e.len.load(Acquire) == len)
}

/// Calls `f(start, len)` for every published region (a new SIGBUS descriptor registers them).
pub(crate) fn for_each(mut f: impl FnMut(usize, usize)) {
    for e in &TABLE {
        let (start, len) = (e.start.load(Acquire), e.len.load(Acquire));
        if start != 0 && len != 0 {
            f(start, len);
        }
    }
}

/// In a fork child (under the table's lock): the parent's handlers in flight are not here.
pub(crate) fn after_fork_child() {
    for e in &TABLE {
        e.users.store(0, Relaxed);
    }
}

/// For the SIGBUS hook (`crate::refill`'s, which passes the SIGBUS-mode descriptor `fd`):
/// fills the block holding `addr` if a published region holds it. Async-signal-safe but for
/// the fill function itself.
pub(crate) fn resolve(fd: i32, addr: usize) -> bool {
    for e in &TABLE {
        if let Some((start, len)) = enter(e, addr) {
            let done = serve(e, fd, start, len, addr);
            e.users.fetch_sub(1, SeqCst);
            return done;
        }
    }
    false
}

/// Enters `e` if it is published and holds `addr`: (start, len), with `users` counted.
fn enter(e: &Entry, addr: usize) -> Option<(usize, usize)> {
    let start = e.start.load(Acquire);
    let len = e.len.load(Acquire);
    if start == 0 || len == 0 || addr < start || addr - start >= len {
        return None;
    }
    e.users.fetch_add(1, SeqCst);
    if e.len.load(SeqCst) != len || e.start.load(SeqCst) != start {
        e.users.fetch_sub(1, SeqCst);
        return None;
    }
    Some((start, len))
}

/// Fills and installs the block of `e` holding `addr` (registered on `fd`); whether it is in
/// place now.
fn serve(e: &Entry, fd: i32, start: usize, len: usize, addr: usize) -> bool {
    let block = e.block.load(Relaxed);
    let offset = (addr - start) / block * block;
    let n = block.min(len - offset);
    let Some(buf) = claim(e, block) else {
        crate::stats::count_refill_failure();
        return false;
    };
    // SAFETY: `buf` is a mapping of `block` >= `n` bytes that this handler alone holds.
    let out = unsafe { std::slice::from_raw_parts_mut(buf.as_ptr(), n) };
    // SAFETY: published with the entry (Release on `len`, read with Acquire in `enter`), and
    // not dropped while this handler is counted in `users`.
    let fill = unsafe { &*e.fill.load(Relaxed) };
    let ok = catch_unwind(AssertUnwindSafe(|| fill(offset, out))).unwrap_or(false);
    let dst = start + offset;
    // SAFETY: `buf` holds `n` bytes; `dst..dst + n` lies in the region, registered on `fd`.
    let installed = ok && unsafe { uffd::copy(fd, dst, buf.as_ptr(), n) }.is_ok();
    release(e, buf, block);
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

/// A fill buffer of `block` bytes: one kept by `e`, or a new mapping.
fn claim(e: &Entry, block: usize) -> Option<NonNull<u8>> {
    for b in &e.buffers {
        if let Some(p) = NonNull::new(b.swap(null_mut(), Acquire)) {
            return Some(p);
        }
    }
    mem::map_anon(block, mem::page_size()).ok()
}

/// Gives `buf` back to `e`'s kept buffers, or unmaps it when they are all kept.
fn release(e: &Entry, buf: NonNull<u8>, block: usize) {
    for b in &e.buffers {
        if b.compare_exchange(null_mut(), buf.as_ptr(), Release, Relaxed)
            .is_ok()
        {
            return;
        }
    }
    // SAFETY: a buffer mapped by `claim`, held by this handler alone.
    unsafe { mem::unmap(buf, block) };
}
