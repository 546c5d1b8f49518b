//! How one block of a refill region is made, by the refill thread (`crate::refill`) and in a
//! SIGBUS handler (`crate::refill_here`) alike: the fill function writes the block into a fill
//! buffer of the region's, which is then put in place, and the block is handed to the
//! lazy-free path (`crate::refill_lazy`). Owns the choice between moving the buffer's pages
//! into place (`UFFDIO_MOVE`, Linux 6.8) and copying them (`UFFDIO_COPY`), and the recycling
//! of a region's oldest blocks near the memory cgroup's limit. Async-signal-safe but for the fill function:
//! system calls and atomics only; it never allocates or locks, and never reads how memory
//! stands itself (the caller asks `crate::short::Room::recycle_for` the block's bytes, by the
//! means its thread has).
//!
//! | memory for the block | the buffer before the fill | put in place by | charged to the cgroup |
//! |---|---|---|---|
//! | enough (the steady state away from the limit) | as it is (its pages fault in once) | copy: the buffer keeps its pages | the block |
//! | recycle, moves | the oldest block's pages moved into it, unless it holds pages | move | nothing: the oldest block's pages are the new block's |
//! | recycle, no moves | as it is; the oldest blocks' pages dropped first (MADV_DONTNEED) | copy | the block, less what was dropped |
//!
//! *Recycle* is `recycle_for`: memory is short by the headroom rule, or the block's charge
//! would pass the cgroup's ceiling and the kernel would reclaim in the fill's path. Moving
//! needs a kernel that moves pages (probed once, [`decide_moves`]), `VRANGE_REFILL_MOVE` not
//! `off`, and buffers registered on the region's descriptor
//! (`vrange_sys::uffd::register_move_target`: a move's destination must be); a move the kernel
//! refuses for a block (EBUSY: a page shared with a fork child; EINVAL: the region and its
//! buffer differ, say one mlocked) falls back to the copy for that block, and EINVAL stops the
//! region's moves until its buffers are registered again. Moving pays near the limit, where a
//! copied block is charged and the cgroup reclaims as many older pages to make room, and a
//! recycled block's pages would be freed only for the copy to allocate as many again; away
//! from it the copy stays: a moved-out buffer has no pages, and faulting them in again costs
//! more than the copy's allocation.
//!
//! A block the program wrote goes with its recycling, moved or dropped (refill regions are
//! meant to be read); a block present when its install comes (another fill put it there) is
//! kept, page by page.

use crate::extents::Kind;
use crate::refill_lazy::{Place, Run};
use crate::refill_order::Order;
use crate::regions;
use std::os::fd::RawFd;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU8};
use vrange_sys::uffd::{self, SrcHole};
use vrange_sys::{mem, settings};

/// The setting that turns moves off (a switch, read once; default on).
const MOVE_SETTING: &str = "VRANGE_REFILL_MOVE";

/// Whether refill regions move pages: [`UNDECIDED`], [`COPY`] or [`MOVE`].
static MOVES: AtomicU8 = AtomicU8::new(UNDECIDED);
const UNDECIDED: u8 = 0;
const COPY: u8 = 1;
const MOVE: u8 = 2;

/// Decides, once per process, whether refill regions move pages: the kernel moves them
/// (`vrange_sys::probe::uffd_move`, one real move on a scratch mapping) and `VRANGE_REFILL_MOVE`
/// is not `off` (a malformed value is reported once and counts as `on`). Called when a region
/// is created, never in a handler.
pub(crate) fn decide_moves() {
    if MOVES.load(Relaxed) == UNDECIDED {
        let on = match settings::var(MOVE_SETTING) {
            None => true,
            Some(v) => settings::parse_switch(v).unwrap_or_else(|| {
                settings::warn(MOVE_SETTING, v, settings::SWITCH_GRAMMAR, &"on");
                true
            }),
        };
        let moves = on && vrange_sys::probe::uffd_move();
        MOVES.store(if moves { MOVE } else { COPY }, Relaxed);
    }
}

/// Whether refill regions move pages (as [`decide_moves`] decided). Async-signal-safe.
pub(crate) fn moves() -> bool {
    MOVES.load(Relaxed) == MOVE
}

/// What a refill region keeps for its fills, whichever thread makes them.
pub(crate) struct Blocks {
    /// Its blocks, in the order they were filled: [`recycle_oldest`] takes the oldest.
    pub(crate) order: Order,
    /// The region moves pages: its fill buffers are move targets on its descriptor, and no
    /// move was refused with EINVAL since they were registered ([`map_buffers`],
    /// [`target_again`]).
    pub(crate) moves: AtomicBool,
    /// Blocks made and not yet lazily freed (`crate::refill_lazy`).
    pub(crate) lazy: Run,
}

/// Blocks a region lists at most (a larger region's oldest go unlisted: the kernel takes them).
const ORDER_MAX: usize = 1 << 16;

impl Blocks {
    /// For a region of `len` bytes in blocks of `block`, moving pages if `moves`.
    pub(crate) fn new(len: usize, block: usize, moves: bool) -> Blocks {
        Blocks {
            order: Order::new(len.div_ceil(block).min(ORDER_MAX)),
            moves: AtomicBool::new(moves),
            lazy: Run::default(),
        }
    }
}

/// Maps `len` bytes of fill buffers for a region registered on `fd` (4 KiB pages: a move takes
/// a huge page apart) and, where the process moves pages, registers them as a move target
/// there. Returns them and whether they are a target. Not in a handler.
///
/// # Errors
/// The errno of mmap(2).
pub(crate) fn map_buffers(fd: RawFd, len: usize) -> std::io::Result<(NonNull<u8>, bool)> {
    let at = mem::map_anon(len, mem::page_size())?;
    let _ = mem::advise_huge(at.as_ptr(), len, false);
    let target = moves() && uffd::register_move_target(fd, at.as_ptr() as usize, len).is_ok();
    Ok((at, target))
}

/// On a new descriptor (the program closed the old one, and the registrations went with it):
/// registers a region's fill buffers (`len` bytes at `at`) as a move target again and lets the
/// region move pages again where they are a target.
pub(crate) fn target_again(fd: RawFd, blocks: &Blocks, at: NonNull<u8>, len: usize) {
    let target = moves() && uffd::register_move_target(fd, at.as_ptr() as usize, len).is_ok();
    blocks.moves.store(target, Relaxed);
}

/// Lazily frees, now, the blocks made and not yet freed of every region of `kind`, whose
/// blocks and block size `parts` gives from its table entry's state.
///
/// # Safety
/// Regions of `kind` record a `T` as their state.
pub(crate) unsafe fn flush_lazy_each<T>(kind: Kind, parts: impl Fn(&T) -> (&Blocks, usize)) {
    regions::each(kind, |start, _| {
        let Some(inside) = regions::enter(start) else {
            return;
        };
        // SAFETY: a `T` (the caller's promise), alive while this thread is inside the region.
        let state = unsafe { &*inside.entry.state().cast::<T>() };
        let (blocks, block) = parts(state);
        blocks.lazy.flush(Place {
            start: inside.start,
            len: inside.len,
            block,
        });
    });
}

/// A refill region as its fills see it.
pub(crate) struct Region<'a> {
    /// The descriptor it is registered on.
    pub(crate) fd: RawFd,
    pub(crate) start: usize,
    pub(crate) len: usize,
    pub(crate) block: usize,
    pub(crate) blocks: &'a Blocks,
}

impl Region<'_> {
    fn place(&self) -> Place {
        Place {
            start: self.start,
            len: self.len,
            block: self.block,
        }
    }
}

/// A fill buffer of the region's block size.
pub(crate) struct Buffer {
    pub(crate) at: NonNull<u8>,
    /// One of the region's buffers, registered with them ([`map_buffers`]); not a buffer
    /// mapped for one fill.
    pub(crate) target: bool,
    /// Holds pages, as far as is known: the last fill's, copied into place and kept.
    pub(crate) holds: bool,
}

/// Makes the block of `region` holding `addr` in `buf`: recycles the oldest blocks first when
/// `recycle(bytes)` says so for the block's bytes, calls `fill(offset, buffer)` (a panic counts
/// as a failure) and puts the block in place (see the module documentation). Returns whether
/// it is in place; a failure is counted.
pub(crate) fn make(
    region: &Region,
    addr: usize,
    buf: &mut Buffer,
    recycle: impl FnOnce(u64) -> bool,
    fill: impl FnOnce(usize, &mut [u8]) -> bool,
) -> bool {
    let offset = (addr - region.start) / region.block * region.block;
    let n = region.block.min(region.len - offset);
    let moving = buf.target && region.blocks.moves.load(Relaxed);
    let recycling = recycle(n as u64);
    let held = buf.holds;
    let moved_in = if recycling {
        let into = (moving && !held).then_some(buf.at);
        recycle_oldest(region, offset, n, into)
    } else {
        0
    };
    // SAFETY: the buffer is `block` >= `n` bytes, this fill's alone; a missing page of it
    // faults in as usual (a move target takes no fault).
    let out = unsafe { std::slice::from_raw_parts_mut(buf.at.as_ptr(), n) };
    let ok = catch_unwind(AssertUnwindSafe(|| fill(offset, out))).unwrap_or(false);
    buf.holds = true;
    if !ok {
        crate::stats::count_refill_failure();
        return false;
    }
    if !held {
        // The fill made the buffer's pages that no old block gave.
        crate::last_room::charged(n.saturating_sub(moved_in) as i64);
    }
    // Counted before the install, which lets a thread waiting in the fault go on.
    crate::stats::count_refill(n);
    let dst = region.start + offset;
    let installed = if moving && recycling {
        move_in(region, dst, buf, n)
    } else {
        copy_in(region.fd, dst, buf.at, n)
    };
    if !installed {
        // Not charged (ENOMEM): the fault goes on to its SIGBUS.
        crate::stats::count_refill_failure();
        return false;
    }
    // Clean lazy pages, the first the kernel drops when memory is short: at once while it is,
    // else with the blocks made next to it.
    region.blocks.lazy.made(region.place(), offset, recycling);
    // Blocks past index u32::MAX (a region of more than 2^32 blocks) are not listed: never
    // recycled, only taken by the kernel.
    if let Ok(b) = u32::try_from(offset / region.block) {
        region.blocks.order.push(b);
    }
    true
}

/// Copies `n` bytes at `buf` into the missing pages at `dst` (present ones kept), charged.
fn copy_in(fd: RawFd, dst: usize, buf: NonNull<u8>, n: usize) -> bool {
    // SAFETY: `buf` holds `n` bytes; `dst..dst + n` lies in the region, registered on `fd`.
    let copied = unsafe { uffd::copy(fd, dst, buf.as_ptr(), n) }.is_ok();
    if copied {
        crate::last_room::charged(n as i64);
    }
    copied
}

/// Moves the buffer's pages into the missing pages at `dst`; where the kernel refuses (it
/// stops at the page), copies the rest.
fn move_in(region: &Region, dst: usize, buf: &mut Buffer, n: usize) -> bool {
    // SAFETY: the buffer is this fill's alone, its content written (a hole in it reads zero,
    // and so does the block's page across from it); nothing refers into it.
    match unsafe { uffd::move_pages(region.fd, dst, buf.at.as_ptr() as usize, n, SrcHole::Zero) } {
        Ok(moved) => {
            crate::stats::count_refill_moved(moved);
            // Pages across from present ones stay in the buffer.
            buf.holds = moved < n;
            true
        }
        Err(stopped) => {
            refused(region, &stopped.error);
            crate::stats::count_refill_moved(stopped.at);
            let at = stopped.at;
            // SAFETY: the part not moved is intact; `at` is page-aligned (where it stopped).
            let rest = unsafe { NonNull::new_unchecked(buf.at.as_ptr().add(at)) };
            copy_in(region.fd, dst + at, rest, n - at)
        }
    }
}

/// A move refused with EINVAL will be refused again (the region and its buffer differ, or the
/// buffer is not registered on the descriptor): the region copies from now on.
fn refused(region: &Region, e: &std::io::Error) {
    if e.raw_os_error() == Some(libc::EINVAL) {
        region.blocks.moves.store(false, Relaxed);
    }
}

/// Blocks looked at per fill for one the kernel has not taken.
const RECYCLE_LOOK: usize = 8;

/// The block at `current` (`need` bytes) is made in recycled memory: the region's oldest
/// blocks that the kernel has not taken give their pages, the first into the buffer at `into`
/// (a move target holding no pages) when given, the rest (and a first the kernel would not
/// move) back to the kernel (MADV_DONTNEED), until a block's worth is had. Those blocks are
/// made again when touched, as if the kernel had taken them. Returns the bytes moved into the
/// buffer.
fn recycle_oldest(
    region: &Region,
    current: usize,
    need: usize,
    mut into: Option<NonNull<u8>>,
) -> usize {
    let page = mem::page_size();
    let (mut had, mut moved) = (0, 0);
    for _ in 0..RECYCLE_LOOK {
        if had >= need {
            break;
        }
        let Some(b) = region.blocks.order.pop() else {
            break;
        };
        let offset = b as usize * region.block;
        if offset == current || offset >= region.len {
            continue;
        }
        let len = region.block.min(region.len - offset);
        let old = region.start + offset;
        let resident = mem::resident_pages(old as *mut u8, len).unwrap_or(0) * page;
        if resident == 0 {
            continue;
        }
        // What moves into the buffer stays charged; the rest is given back.
        let mut kept = 0;
        if let Some(buf) = into.take() {
            let n = len.min(need);
            let to = buf.as_ptr() as usize;
            // SAFETY: a block of this live region (the caller is inside it), whose content is
            // the fill's, made again when a thread touches it; the buffer is this fill's and
            // holds no pages, so each page of the block finds its place free.
            match unsafe { uffd::move_pages(region.fd, to, old, n, SrcHole::Skip) } {
                Ok(_) => kept = resident.min(n),
                Err(stopped) => refused(region, &stopped.error),
            }
        }
        // What did not move goes back to the kernel.
        // SAFETY: as above: the block is the fill's to make again.
        if kept < resident && unsafe { mem::purge_forced(old as *mut u8, len) }.is_err() {
            continue;
        }
        crate::last_room::charged(-((resident - kept) as i64));
        moved += kept;
        had += resident;
    }
    crate::stats::count_refill_recycled(had, moved);
    moved
}
