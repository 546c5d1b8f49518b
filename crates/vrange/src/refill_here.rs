//! Refill regions filled on the faulting thread (opt-in: [`crate::RefillRegion::filled_here`],
//! C `VRANGE_FILL_HERE`). The region is registered in MISSING mode on the process's SIGBUS-mode
//! userfaultfd (`crate::sigbus`), so a touch of a missing page raises SIGBUS on the touching
//! thread itself; vrange's SIGBUS handler (`vrange_sys::process::hook_sigbus`, installed by the
//! first such region, in front of the program's action) finds the region, calls its fill
//! function there with a buffer of the region's, puts the block in place (`UFFDIO_COPY` or
//! `UFFDIO_MOVE`, pages present meanwhile kept), hands it to the lazy-free path and returns:
//! the access is retried and succeeds. No other thread wakes: a fault costs the signal's
//! delivery and return, the fill and the install. A SIGBUS at any other address, and one whose fill fails, goes to the
//! program's own action (its handler may place the page with [`crate::fill`] and return).
//!
//! Each region's entry in the region table (`crate::regions`) keeps a [`Here`]: its block, fill
//! function, fill buffers and the blocks it filled. The handler finds the region by one
//! lock-free lookup there and is counted inside it while it fills; removing a region
//! unpublishes it and waits until no handler is inside before its fill function is dropped.
//! Each region has [`BUFFERS`] fill buffers, one mapping made with the region (a move target
//! on the descriptor where the kernel moves pages), claimed by swapping them out of their cell;
//! when all are in use a fault maps one of its own (mmap is async-signal-safe), fills it and
//! unmaps it after.
//!
//! A block is made as the refill thread makes it (`crate::refill_block`): near the cgroup's
//! limit (`crate::short::Room::recycle_for`) the region's oldest blocks give their pages first
//! (moved into the buffer, or given back), taken from a lock-free list of the blocks filled
//! (`crate::refill_order`). How memory stands comes from the last headroom reading
//! (`crate::last_room::recent`: the reclaimer thread reads it at each tick while such regions
//! live, and every fill counts what it charges since), because reading it takes a lock and
//! files, neither of which a signal handler may touch; the first region starts the reclaimer
//! thread for that.
//!
//! Differences from the refill thread's regions: the fill function runs on the touching thread,
//! inside its SIGBUS handler, several at once (it must be `Sync`, must not touch a refill
//! region, and may allocate or lock only what the touching code does not hold at that
//! instant); and memory counts as short by a reading up to one reclaimer tick old, adjusted by
//! this process's own fills, rather than by a reading before each fill.

use crate::extents::Kind;
use crate::refill_block::{self, Blocks, Buffer};
use crate::regions;
use crate::Error;
use std::ptr::NonNull;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use vrange_sys::{mem, uffd};

/// A fill function called on faulting threads, several at once.
pub(crate) type SharedFill = Box<dyn Fn(usize, &mut [u8]) -> bool + Send + Sync>;

/// Fill buffers a region keeps (faults filled at once beyond this map their own).
const BUFFERS: usize = 4;

/// A buffer's cell holding it while it is not claimed: its address, this bit set while it
/// holds pages (buffers are page-aligned).
const HOLDS: usize = 1;

/// What a region filled on the faulting thread keeps, in its region table entry.
struct Here {
    block: usize,
    fill: SharedFill,
    /// Its fill buffers: one mapping of [`BUFFERS`] blocks, unmapped with the region.
    area: NonNull<u8>,
    /// The buffers not claimed: address | [`HOLDS`]; 0 while claimed.
    buffers: [AtomicUsize; BUFFERS],
    /// Its blocks in the order they were filled, and whether it moves pages.
    blocks: Blocks,
}

/// Regions live now (the reclaimer keeps their headroom reading while any is).
static LIVE: AtomicUsize = AtomicUsize::new(0);

/// Whether any region filled on the faulting thread lives.
pub(crate) fn live() -> bool {
    LIVE.load(Relaxed) > 0
}

/// Publishes a region (mapped and registered on `fd` by the caller) with its fill function,
/// and maps its fill buffers. `Error::Os(ENOMEM)` when the region table is full.
pub(crate) fn add(
    fd: i32,
    start: usize,
    len: usize,
    block: usize,
    fill: SharedFill,
) -> Result<(), Error> {
    refill_block::decide_moves();
    // The buffers' bytes; `i * block` below stays under it.
    let area_len = BUFFERS.checked_mul(block).ok_or(Error::Os(libc::ENOMEM))?;
    let (area, target) = refill_block::map_buffers(fd, area_len)?;
    let here = Box::into_raw(Box::new(Here {
        block,
        fill,
        area,
        buffers: std::array::from_fn(|i| AtomicUsize::new(area.as_ptr() as usize + i * block)),
        blocks: Blocks::new(len, block, target),
    }));
    if let Err(e) = regions::record(Kind::RefillHere, start, len, here.cast()) {
        // SAFETY: from `Box::into_raw` just above, never published; its area was never used.
        unsafe {
            drop(Box::from_raw(here));
            mem::unmap(area, area_len);
        }
        return Err(e);
    }
    LIVE.fetch_add(1, Relaxed);
    Ok(())
}

/// Unpublishes the region at `start..start + len`, waits for the handlers inside it, unmaps its
/// buffers, and returns its fill function (to be dropped outside any lock). None if no such
/// region is published.
pub(crate) fn remove(start: usize, len: usize) -> Option<SharedFill> {
    let here = regions::remove(Kind::RefillHere, start, len)?.cast::<Here>();
    LIVE.fetch_sub(1, Relaxed);
    // SAFETY: recorded by `add` from `Box::into_raw`; no handler is inside the region any more.
    let here = unsafe { Box::from_raw(here) };
    // SAFETY: the region's buffers, claimed by no handler (none is inside).
    unsafe { mem::unmap(here.area, BUFFERS * here.block) };
    Some(here.fill)
}

/// Registers every published region, and its fill buffers, on a new SIGBUS descriptor.
pub(crate) fn reregister(fd: i32) {
    regions::each(Kind::RefillHere, |start, len| {
        let _ = uffd::register_missing(fd, start, len);
        if let Some(inside) = regions::enter(start) {
            // SAFETY: recorded by `add` as a `Here`, alive while this thread is inside.
            let here = unsafe { &*inside.entry.state().cast::<Here>() };
            refill_block::target_again(fd, &here.blocks, here.area, BUFFERS * here.block);
        }
    });
}

/// Lazily frees every region's blocks made and not yet freed (`crate::refill_lazy`): the
/// reclaimer's tick, while such regions live.
pub(crate) fn flush_lazy() {
    // SAFETY: `add` records a `Here` for each region of this kind.
    unsafe { refill_block::flush_lazy_each(Kind::RefillHere, |h: &Here| (&h.blocks, h.block)) };
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
    let Some(mut buf) = claim(here) else {
        crate::stats::count_refill_failure();
        return false;
    };
    let region = refill_block::Region {
        fd,
        start: inside.start,
        len: inside.len,
        block: here.block,
        blocks: &here.blocks,
    };
    let made = refill_block::make(
        &region,
        addr,
        &mut buf,
        |need| crate::last_room::recent().is_some_and(|room| room.recycle_for(need)),
        |offset, out| (here.fill)(offset, out),
    );
    release(here, buf);
    made
}

/// A fill buffer of the region's block: one of its own, or a new mapping.
fn claim(here: &Here) -> Option<Buffer> {
    for b in &here.buffers {
        let cell = b.swap(0, Acquire);
        if cell != 0 {
            return Some(Buffer {
                // SAFETY: a cell holds a buffer's address, never 0, or 0.
                at: unsafe { NonNull::new_unchecked((cell & !HOLDS) as *mut u8) },
                target: true,
                holds: cell & HOLDS != 0,
            });
        }
    }
    let at = mem::map_anon(here.block, mem::page_size()).ok()?;
    Some(Buffer {
        at,
        target: false,
        holds: false,
    })
}

/// Gives a buffer of the region's back to a free cell, or unmaps one mapped for one fill.
fn release(here: &Here, buf: Buffer) {
    if !buf.target {
        // SAFETY: mapped by `claim` for this fill alone.
        unsafe { mem::unmap(buf.at, here.block) };
        return;
    }
    let cell = buf.at.as_ptr() as usize | if buf.holds { HOLDS } else { 0 };
    // There are as many empty cells as buffers claimed, this one's among them: a pass finds
    // none only while other threads claim and release meanwhile.
    while !here
        .buffers
        .iter()
        .any(|b| b.compare_exchange(0, cell, Release, Relaxed).is_ok())
    {}
}
