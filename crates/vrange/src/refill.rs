//! Refill regions: memory that stays volatile for as long as the program holds it, whose
//! content is whatever a fill function produces, block by block. The decompressor of the 2014
//! design: a compressed file served as one flat decompressed array, each block decompressed
//! again when the program touches it after the system took it back.
//!
//! - The region is mapped but never populated, and registered in MISSING mode on the
//!   process's handled userfaultfd (`vrange_sys::uffd::open_handled`).
//! - A thread that touches a missing page (never filled, or taken back) waits in the kernel;
//!   the `vrange-refill` thread reads the fault, calls the region's fill function for the
//!   whole block with the region's fill buffer, puts the block in place (`crate::refill_block`:
//!   one `UFFDIO_COPY`, or one `UFFDIO_MOVE` of the buffer's pages; pages present meanwhile
//!   are kept) and hands it back to the kernel with MADV_FREE: clean lazy pages, the first the
//!   kernel drops under pressure, so a region may be far larger than its memory cgroup's
//!   limit. The faulting thread then simply continues.
//! - Keeping the pages: near the memory cgroup's limit (`crate::short::Room::recycle_for`,
//!   asked through `crate::reclaim::room` before each fill: memory is short by the headroom
//!   rule, or the block's charge would pass the limit and the kernel would reclaim in the
//!   fill's path), a fill first takes the pages of the region's oldest blocks that the kernel
//!   has not taken: moved into its buffer where the kernel moves pages (no charge, no copy),
//!   else given back (MADV_DONTNEED) so that the new block is charged without reclaim. Those
//!   blocks are made again when touched. The region recycles the memory it has, oldest block
//!   first, instead of the cgroup reclaiming at every fill whatever its scan finds
//!   (`crate::refill_block`).
//! - A page never purged costs nothing on access; a purged one costs one fault and the fill.
//! - A fill that fails (returns false or panics) makes the access raise SIGBUS in the faulting
//!   thread, with `si_addr` the address and `si_code` SI_QUEUE (raised by the refill thread on
//!   its behalf, see `vrange_sys::process::raise_sigbus`); a handler may place the content with
//!   [`crate::fill`] and return, or return without: the access is retried, and the fill with
//!   it.
//! - A page the program writes is dirty again and stays until its block is made again (after
//!   the kernel took another page of it): the fill leaves the written page's content alone, but
//!   hands the whole block back to the lazy-free path, so the write may go with it later.
//!   Refill regions are meant to be read.
//!
//! The refill thread lives while refill regions do (it leaves a second after the last one is
//! freed). It sleeps in poll(2) between faults, except while faults come close together (within
//! 100 µs of the last fill): then it polls without sleeping for 100 µs after each, yielding its
//! CPU between looks (to the faulting thread, when both share one), so that a
//! thread reading through missing blocks does not wait for it to wake as well. The fill function runs on it, one call at a time for the whole process, and
//! must not touch a refill region itself (it would wait for its own fill) nor free the region
//! it fills. A fork child inherits no registration: there, missing pages read zero.

use crate::extents::Kind;
use crate::refill_block::{self, Blocks, Buffer};
use crate::regions;
use crate::userfault::Held;
use crate::Error;
use std::cell::UnsafeCell;
use std::ptr::NonNull;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use vrange_sys::clock::now_ns;
use vrange_sys::lock::{Lock, Rank};
use vrange_sys::{mem, uffd};

/// The process's handled userfaultfd (faults wait for the refill thread).
pub(crate) static UFFD: Held = Held::new(Rank::RefillOpen, uffd_after_fork_child);

/// Fills the block at `offset` (bytes from the region's start) into `buf` (the whole block);
/// returns whether it succeeded.
type FillFn = Box<dyn FnMut(usize, &mut [u8]) -> bool + Send>;

/// What a refill region filled by the refill thread keeps, in its region table entry.
struct Filler {
    block: usize,
    /// Its blocks in the order they were filled, and whether it moves pages.
    blocks: Blocks,
    /// The refill thread's alone (see the `Sync` impl).
    work: UnsafeCell<Work>,
}

struct Work {
    fill: FillFn,
    /// `block` bytes mapped for the region (`refill_block::map_buffers`), unmapped with it.
    buffer: Buffer,
}

// SAFETY: `work` is touched by the refill thread only (one per process, serving one fault at a
// time), inside the region (`regions::enter`), and by the dropping handle after the region was
// removed and drained; the fill function is `Send`.
unsafe impl Sync for Filler {}

impl Drop for Filler {
    fn drop(&mut self) {
        // SAFETY: mapped by `create` for this region alone; nothing refers into it any more.
        unsafe { mem::unmap(self.work.get_mut().buffer.at, self.block) };
    }
}

/// The refill thread's life: regions it serves and whether it runs, changed together under
/// [`LIFE`], so that a region is never left without a thread. A short lock (no fill runs under
/// it), held across fork: a fork child has no refill thread.
static LIFE: Lock = Lock::with_child_hook(Rank::RefillThread, Some(after_fork_child));
/// Refill regions served by the thread (changed under [`LIFE`]).
static SERVED: AtomicUsize = AtomicUsize::new(0);
/// Whether this process has a refill thread (changed under [`LIFE`]).
static THREAD: AtomicBool = AtomicBool::new(false);

/// A refill region: volatile for as long as it lives, its content made block by block by a
/// fill function, on first access and again whenever the system took a block back (see the
/// module documentation). Reading any byte gives what the fill function makes for it (waiting
/// for the fill if its block is missing); writing keeps the page until its block is made again.
/// Unmapped on drop.
#[derive(Debug)]
pub struct RefillRegion {
    start: NonNull<u8>,
    len: usize,
    /// Filled on the faulting thread (`crate::refill_here`), not by the refill thread.
    here: bool,
}

// SAFETY: the region is memory owned by this handle; the fill function is `Send` and runs on
// the refill thread only.
unsafe impl Send for RefillRegion {}
// SAFETY: as above; no method mutates through `&self`.
unsafe impl Sync for RefillRegion {}

mapping_accessors!(RefillRegion);

impl RefillRegion {
    /// What [`RefillRegion::new`] does.
    pub(crate) fn create(
        len: usize,
        block: usize,
        fill: impl FnMut(usize, &mut [u8]) -> bool + Send + 'static,
    ) -> Result<RefillRegion, Error> {
        let (len, block) = checked(len, block)?;
        refill_block::decide_moves();
        // A descriptor the program closed is replaced here; the refill thread registers the
        // live regions on the new one (see `run`).
        let fd = UFFD.ensure(uffd::open_handled)?.fd;
        let start = mem::map_anon(len, mem::page_size())?;
        // A huge page would be filled (and dropped) whole, not by block.
        let _ = mem::advise_huge(start.as_ptr(), len, false);
        let at = start.as_ptr() as usize;
        let buffer =
            uffd::register_missing(fd, at, len).and_then(|()| refill_block::map_buffers(fd, block));
        let (buffer, target) = match buffer {
            Ok(b) => b,
            Err(e) => {
                // SAFETY: just mapped, never handed out.
                unsafe { mem::unmap(start, len) };
                return Err(e.into());
            }
        };
        let filler = Box::into_raw(Box::new(Filler {
            block,
            blocks: Blocks::new(len, block, target),
            work: UnsafeCell::new(Work {
                fill: Box::new(fill),
                buffer: Buffer {
                    at: buffer,
                    target: true,
                    holds: false,
                },
            }),
        }));
        if let Err(e) = regions::record(Kind::Refill, at, len, filler.cast()) {
            // SAFETY: never published (the filler unmaps its buffer); the mapping was never
            // handed out.
            unsafe {
                drop(Box::from_raw(filler));
                mem::unmap(start, len);
            }
            return Err(e);
        }
        let region = RefillRegion {
            start,
            len,
            here: false,
        };
        // Counted, and the thread's flag set, under the lock the thread decides to exit under.
        let spawn = LIFE.with(|| {
            SERVED.fetch_add(1, Relaxed);
            !THREAD.swap(true, Relaxed)
        });
        if spawn {
            if let Err(e) = vrange_sys::process::spawn_without_signals("vrange-refill", run) {
                THREAD.store(false, Relaxed);
                drop(region);
                return Err(e.into());
            }
        }
        Ok(region)
    }

    /// What [`RefillRegion::filled_here`] does: the region is registered on the SIGBUS-mode
    /// descriptor, recorded with its fill function in the region table (`crate::refill_here`),
    /// and vrange's SIGBUS handler is installed (once per process).
    pub(crate) fn create_here(
        len: usize,
        block: usize,
        fill: crate::refill_here::SharedFill,
    ) -> Result<RefillRegion, Error> {
        let (len, block) = checked(len, block)?;
        let fd = crate::sigbus::ensure()?;
        vrange_sys::process::hook_sigbus(resolve_here)?;
        let start = mem::map_anon(len, mem::page_size())?;
        let _ = mem::advise_huge(start.as_ptr(), len, false);
        let at = start.as_ptr() as usize;
        let published = uffd::register_missing(fd, at, len)
            .map_err(Error::from)
            .and_then(|()| crate::refill_here::add(fd, at, len, block, fill));
        if let Err(e) = published {
            // SAFETY: just mapped, never handed out.
            unsafe { mem::unmap(start, len) };
            return Err(e);
        }
        // Its fills read the headroom the reclaimer thread reads (`crate::last_room`): a first
        // reading now, then each tick.
        crate::reclaim::ensure_running();
        let _ = crate::reclaim::room();
        Ok(RefillRegion {
            start,
            len,
            here: true,
        })
    }

    /// Takes back a region given up with [`RefillRegion::into_raw`] (`len` rounded up to a
    /// page).
    ///
    /// # Errors
    /// [`Error::NotRegion`] if they do not name a live refill region exactly.
    ///
    /// # Safety
    /// The caller owns the region (no other handle to it exists).
    pub unsafe fn from_raw(ptr: *mut u8, len: usize) -> Result<RefillRegion, Error> {
        let len = crate::span::region_len(len).map_err(|_| Error::NotRegion)?;
        let start = NonNull::new(ptr).ok_or(Error::NotRegion)?;
        let here = match [Kind::Refill, Kind::RefillHere]
            .into_iter()
            .find(|k| regions::exactly(*k, ptr as usize, len).is_some())
        {
            Some(kind) => kind == Kind::RefillHere,
            None => return Err(Error::NotRegion),
        };
        Ok(RefillRegion { start, len, here })
    }

    /// The handle of the live refill region the region table found exactly at `start`, `len`
    /// (`here`: filled on the faulting thread).
    pub(crate) fn adopt(start: usize, len: usize, here: bool) -> RefillRegion {
        RefillRegion {
            start: NonNull::new(start as *mut u8).expect("a region starts above 0"),
            len,
            here,
        }
    }
}

impl Drop for RefillRegion {
    fn drop(&mut self) {
        let start = self.start.as_ptr() as usize;
        if self.here {
            let fill = crate::refill_here::remove(start, self.len);
            // SAFETY: this handle owned the mapping; no handler fills it any more.
            unsafe { mem::unmap(self.start, self.len) };
            drop(fill);
            return;
        }
        // Waits for a fill in progress (the refill thread is inside the region meanwhile).
        let filler = regions::remove(Kind::Refill, start, self.len);
        // SAFETY: this handle owned the mapping; the unmap drops its registration.
        unsafe { mem::unmap(self.start, self.len) };
        if let Some(f) = filler {
            LIFE.with(|| SERVED.fetch_sub(1, Relaxed));
            // SAFETY: recorded by `create` from `Box::into_raw`, removed and drained: the refill
            // thread is not inside it and never will be. Dropped outside any lock (the fill
            // function's destructor may take others).
            drop(unsafe { Box::from_raw(f.cast::<Filler>()) });
        }
    }
}

/// vrange's SIGBUS hook (`vrange_sys::process::hook_sigbus`): a fault in a region filled on
/// the faulting thread is filled there, through the SIGBUS-mode descriptor the regions are
/// registered on. Async-signal-safe but for the fill function.
fn resolve_here(addr: usize) -> bool {
    crate::sigbus::current().is_some_and(|fd| crate::refill_here::resolve(fd, addr))
}

/// A region's length rounded up to a page, and its block (capped at the length), or the error
/// for either.
fn checked(len: usize, block: usize) -> Result<(usize, usize), Error> {
    let len = crate::span::region_len(len)?;
    if block == 0 {
        return Err(Error::NotRegion);
    }
    if block % mem::page_size() != 0 {
        return Err(Error::Unaligned);
    }
    Ok((len, block.min(len)))
}

/// Faults closer together than this (from the end of one fill to the next fault read) keep
/// the refill thread awake: it polls without sleeping for this long after each, so that the
/// next fault of a thread reading through missing blocks costs one wake-up (the faulting
/// thread's), not two. An isolated fault costs no polling.
const CLOSE_NS: u64 = 100_000;

/// The refill thread: waits for faults and fills their blocks; exits once a second passes
/// with no refill region left (the next region starts another).
fn run() {
    let mut faults = [uffd::Fault::default(); 16];
    let mut serving = None;
    // When the last fill ended, and until when to poll without sleeping.
    let mut served_at = 0u64;
    let mut awake_until = 0u64;
    loop {
        // Read before the descriptor: a replacement in between is seen at the next turn.
        let generation = UFFD.generation();
        let Some(fd) = UFFD.current() else {
            // Closed by the program: a new region opens a new one (regions of the old one fault
            // in zero pages now). Look again in a while.
            std::thread::sleep(std::time::Duration::from_millis(100));
            if no_regions_left() {
                return;
            }
            continue;
        };
        if serving.is_some_and(|old| old != generation) {
            reregister(fd);
        }
        serving = Some(generation);
        let awake = now_ns() < awake_until;
        if !awake {
            // Before it sleeps: the blocks made and not yet lazily freed go now.
            flush_lazy();
        }
        match uffd::next_faults(fd, if awake { 0 } else { 1000 }, &mut faults) {
            // A thread that faults on this CPU runs first.
            Ok(0) if awake => std::thread::yield_now(),
            Ok(0) if no_regions_left() => return,
            Ok(n) => {
                let read_at = now_ns();
                for f in &faults[..n] {
                    serve(fd, *f);
                }
                let t = now_ns();
                if read_at.saturating_sub(served_at) < CLOSE_NS {
                    awake_until = t + CLOSE_NS;
                }
                served_at = t;
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(100)),
        }
    }
}

/// The program closed the descriptor this thread served (closefrom), and a new region opened
/// another. The old one's file lived until this thread's poll(2) on it returned; its release
/// dropped every region's registration, and until now their missing pages read zero (counted
/// in `descriptors_lost`). Registers the live regions, and their fill buffers, on the new
/// descriptor.
fn reregister(fd: i32) {
    regions::each(Kind::Refill, |start, len| {
        let _ = uffd::register_missing(fd, start, len);
        let Some(inside) = regions::enter(start) else {
            return;
        };
        // SAFETY: recorded by `create` as a `Filler`, alive while this thread is inside.
        let filler = unsafe { &*inside.entry.state().cast::<Filler>() };
        // SAFETY: the refill thread alone reaches `work` while the region is published.
        let w = unsafe { &mut *filler.work.get() };
        refill_block::target_again(fd, &filler.blocks, w.buffer.at, filler.block);
    });
}

/// Lazily frees every region's blocks made and not yet freed (`crate::refill_lazy`).
fn flush_lazy() {
    // SAFETY: `create` records a `Filler` for each region of this kind.
    unsafe { refill_block::flush_lazy_each(Kind::Refill, |f: &Filler| (&f.blocks, f.block)) };
}

/// Whether the thread may leave: no region is left (decided, and the flag cleared, under the
/// lock a new region counts itself under).
fn no_regions_left() -> bool {
    LIFE.with(|| {
        let empty = SERVED.load(Relaxed) == 0;
        if empty {
            THREAD.store(false, Relaxed);
        }
        empty
    })
}

fn serve(fd: i32, f: uffd::Fault) {
    let page = mem::page_size();
    let at = f.addr & !(page - 1);
    // A fault already served (several threads waited on one block): let it go on.
    if matches!(mem::resident_pages(at as *mut u8, page), Ok(1)) {
        let _ = uffd::wake(fd, at, page);
        return;
    }
    let served = regions::enter(f.addr)
        .filter(|inside| inside.entry.kind() == Some(Kind::Refill))
        .map(|inside| {
            // SAFETY: recorded by `create` as a `Filler`, alive while this thread is inside the
            // region (removal drains it first).
            let filler = unsafe { &*inside.entry.state().cast::<Filler>() };
            // SAFETY: the refill thread alone reaches `work` while the region is published.
            let w = unsafe { &mut *filler.work.get() };
            let region = refill_block::Region {
                fd,
                start: inside.start,
                len: inside.len,
                block: filler.block,
                blocks: &filler.blocks,
            };
            // Runs the program's fill function with no lock held.
            refill_block::make(
                &region,
                f.addr,
                &mut w.buffer,
                |need| crate::reclaim::room().is_some_and(|room| room.recycle_for(need)),
                |offset, buf| (w.fill)(offset, buf),
            )
        });
    match served {
        None => {
            // Not a live region (freed meanwhile): let the thread go on.
            let _ = uffd::wake(fd, at, page);
        }
        Some(true) => {}
        Some(false) => {
            // The faulting thread gets SIGBUS as a fault would give it (its wait in the kernel
            // is interrupted by the signal); if it is gone, nothing to do.
            let _ = vrange_sys::process::raise_sigbus(f.tid, f.addr);
        }
    }
}

/// Tries the refill descriptor for [`crate::fill`] (a SIGBUS handler patching a block whose
/// fill failed). Async-signal-safe.
pub(crate) fn current() -> Option<i32> {
    UFFD.current()
}

/// In a fork child (under [`LIFE`]): no refill thread.
fn after_fork_child() {
    THREAD.store(false, Relaxed);
}

/// In a fork child (under the descriptor's lock): no registration; the descriptor goes as the
/// SIGBUS one.
fn uffd_after_fork_child() {
    UFFD.after_fork_child();
}
