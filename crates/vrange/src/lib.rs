//! Volatile ranges for Linux userspace.
//!
//! Mark memory volatile and the kernel may discard it when memory is short; unmark it and learn
//! exactly which pages were lost. The classic `vrange()` semantics of the 2014 volatile-range
//! work, delivered on stock kernels with MADV_FREE and a witness-word proof of survival.
//!
//! ```
//! let region = vrange::Region::new(1 << 20)?;
//! let page = vrange::page_size();
//! // SAFETY: no reference into the region is live while it is volatile.
//! unsafe {
//!     region.as_ptr().write_bytes(7, region.len());
//!     region.mark_volatile(0, region.len())?;
//! }
//! // ... later, before using the data again:
//! let report = region.unmark(0, region.len())?;
//! if report.purged > 0 {
//!     // regenerate: purged pages read as zero
//! }
//! assert_eq!(report.pages, region.len() / page);
//! # Ok::<(), vrange::Error>(())
//! ```
//!
//! # Safety
//! System calls are vrange-sys's (the kernel boundary). In the core, `unsafe` is the atomic
//! proof (`witness`), the lock-free tables (`page_index`, `registry`), the range
//! operations that touch caller memory, and the entry points whose callers promise they own
//! it; each block says what it relies on (`// SAFETY:`, enforced by clippy).

#![deny(unsafe_op_in_unsafe_fn)]

/// The accessors of a handle to a mapping vrange owns (fields `start: NonNull<u8>` and `len`):
/// volatile, scratch and refill regions.
macro_rules! mapping_accessors {
    ($ty:ident) => {
        impl $ty {
            /// The region's first byte.
            pub fn as_ptr(&self) -> *mut u8 {
                self.start.as_ptr()
            }

            /// The region's length in bytes (a page multiple).
            pub fn len(&self) -> usize {
                self.len
            }

            /// Always false: a region is at least a page.
            pub fn is_empty(&self) -> bool {
                false
            }

            /// Gives up the handle without unmapping: the start and length, for `from_raw`
            /// (the C ABI hands regions out this way).
            pub fn into_raw(self) -> (*mut u8, usize) {
                let raw = (self.as_ptr(), self.len);
                std::mem::forget(self);
                raw
            }
        }
    };
}

mod approach;
pub mod coordination;
mod error;
mod extents;
mod features;
mod handle;
mod huge_proof;
mod last_room;
mod lazy;
mod managed;
pub mod order;
mod owned;
mod page_index;
mod publish;
mod reclaim;
mod refill;
mod refill_block;
mod refill_here;
mod refill_lazy;
mod refill_order;
mod region;
mod regions;
mod registry;
mod scratch;
mod shadow;
mod shared;
pub mod short;
mod sigbus;
mod slots;
mod span;
mod state;
mod stats;
mod sync;
mod userfault;
mod witness;

pub use error::{Error, OptionError, Result};
pub use features::{features, CgroupVersion, Features, ThpMode, Unavailable};
pub use handle::{region_containing, Pinned, VolatileRegion};
pub use lazy::{forget, volatile_pages};
pub use managed::Options;
pub use owned::{Content, OwnedRange, Taken};
pub use reclaim::{set_option, OPTIONS};
pub use reclaim::{Config, Headroom, Psi};
pub use refill::RefillRegion;
pub use region::{Huge, Region};
pub use regions::{MAX_FILLED_HERE_REGIONS, MAX_SCRATCH_REGIONS};
pub use registry::{Policy, Priority};
pub use scratch::ScratchRegion;
pub use stats::{
    register_allocator, stats, AllocatorStats, CoordinatorStats, Source, SourceStats, Stats,
};
pub use vrange_sys::mem::page_size;

/// The reclaimer thread: whether it runs, what it listens to, and stopping it. It starts by
/// itself with the first managed or hybrid region (see the crate documentation).
pub mod reclaimer {
    pub use crate::approach::HOT;
    pub use crate::reclaim::{active_sources, catch_up, is_running, stop, FlushHook};

    /// Makes room, in the caller's thread, before it allocates `bytes` more: if its memory
    /// cgroup's headroom (limit minus usage) less `bytes` is under the `VRANGE_HEADROOM` threshold,
    /// volatile memory is purged until twice the threshold is free again, as the thread would do
    /// at its next tick. Returns the bytes this process purged on its own (counted under
    /// [`Source::Headroom`](crate::Source::Headroom)).
    ///
    /// For clients that fill volatile memory faster than the thread's tick (a cache filling at
    /// memory speed can pass a container's limit between two ticks, and volatile memory that is
    /// not yet armed is memory the kernel cannot reclaim without swap). Runs the flush hooks
    /// ([`on_flush`]) first, then costs two `pread`s (the cgroup's usage and its `memory.stat`)
    /// on verified descriptors; one caller at a time (others return 0 at once, or, coordinated,
    /// wait for the answer the first is waiting for).
    ///
    /// While a coordinator (`vrange daemon`) is live, the purge follows its global order instead
    /// of this process's own: the caller asks the coordinator for the room and waits for the
    /// round it runs (the oldest volatile data of any process in the container goes first, this
    /// process's own only in its turn, by the coordinator's request), while the coordinator
    /// stays live, at most forty ping intervals. It purges on its own only for what the
    /// coordinator could not free (it saw
    /// nothing volatile, or this process's cgroup is short where others' purges do not help) and
    /// when the coordinator does not answer or is gone, as without one.
    /// Nothing is purged without a cgroup limit, with `VRANGE_HEADROOM=off`, or while the
    /// reclaimer is disabled.
    pub fn make_room(bytes: usize) -> usize {
        crate::reclaim::make_room(bytes)
    }

    /// How this process's memory stands: its memory cgroup's headroom (the limit, less the
    /// usage, plus the clean page cache) and the `VRANGE_HEADROOM` threshold it must keep;
    /// `None` without a limit (or while its files cannot be read). Two `pread`s (the usage,
    /// `memory.stat`) on kept descriptors, under a short lock shared with [`make_room`].
    ///
    /// For a client that can give back memory of its own instead of taking more (a page cache
    /// recycling its oldest unused page): [`Room::short_for`](crate::short::Room::short_for)
    /// says whether to, by the one rule every purger follows (`vrange::short`).
    pub fn room() -> Option<crate::short::Room> {
        crate::reclaim::room()
    }

    /// As [`room`], from the last reading any thread made (a [`room`], a [`make_room`], the
    /// reclaimer's) less what refill fills charged since: atomics only, no system call, and
    /// nothing of what others charged since it was read. `None` without a reading of the last
    /// three ticks (and the last second).
    ///
    /// For a choice that costs nothing if the reading is stale: a cache that recycles its own
    /// memory while memory is short, and asks [`room`] (or [`make_room`]) before it grows.
    pub fn recent_room() -> Option<crate::short::Room> {
        crate::last_room::recent()
    }

    /// Registers `f`, called by the reclaimer thread at each tick (`VRANGE_POLL_MS`) and by every
    /// purge ([`crate::purge`], the budget's and headroom's) before it chooses victims: the place
    /// to mark volatile whatever the client kept pinned only to spare its hot path a state change
    /// (what another thread's flush is marking at that moment is left to it, and a later purge
    /// takes it).
    /// `f` runs on any thread, never twice at once in one thread; it may mark and unmark, and must
    /// not wait for a thread that could be purging.
    pub fn on_flush(f: impl Fn() + Send + Sync + 'static) -> FlushHook {
        crate::reclaim::on_flush(f)
    }
}

/// Statistics other processes publish (`vrange stat`, `vrange run --stats`): each process whose
/// reclaimer runs writes `vrange-<pid>.stats` into a directory private to its user.
pub mod published {
    pub use crate::publish::{default_dir, parse, read, render, sweep, Unavailable};
}

/// What an unmark found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Unmarked {
    /// Pages in the range.
    pub pages: usize,
    /// Pages that were volatile.
    pub volatile: usize,
    /// Pages whose content the kernel discarded while they were volatile; they read as zero.
    pub purged: usize,
}

impl Unmarked {
    /// Whether any content was lost (the C API's `*purged`).
    pub fn was_purged(&self) -> bool {
        self.purged > 0
    }
}

/// The modes of the classic call [`vrange()`] (the C `vrange(2)`'s `mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The system may discard the pages under memory pressure ([`mark_volatile`]).
    Volatile,
    /// As `Volatile`, and a touch of a discarded page raises SIGBUS
    /// ([`mark_volatile_sigbus`]).
    VolatileSigbus,
    /// Pin the pages again and report whether anything was discarded ([`unmark`]).
    NoVolatile,
}

/// What a classic call works on, found by one lookup in the region table. Async-signal-safe.
enum Target {
    Empty,
    /// Memory no region of the library holds: the kernel path.
    Arbitrary(span::Span),
    /// A region of ranges (managed, lazy, hybrid, shared); the range holding the first page.
    Ranges(span::Span, managed::First),
}

fn target(ptr: *mut u8, len: usize) -> Result<Target> {
    let span = span::Span::new(ptr as usize, len)?;
    if span.is_empty() {
        return Ok(Target::Empty);
    }
    Ok(match regions::find(span)? {
        None => Target::Arbitrary(span),
        Some(regions::Owner::Ranges(idx, slot)) => Target::Ranges(span, (idx, slot)),
        // Scratch memory is always volatile and refill memory is its fill function's: neither
        // can be pinned.
        Some(regions::Owner::Extent(..)) => return Err(Error::Unsupported),
    })
}

/// Marks `[ptr, ptr + len)` volatile: the system may discard its pages when memory is short,
/// and [`unmark`] will say what it did. Returns the bytes marked (`len` rounded up to a page).
///
/// On arbitrary private anonymous memory this is the kernel path ([`lazy`](crate::Policy::Lazy)):
/// see the crate documentation. Inside a [`VolatileRegion`] (or `vrange_alloc` memory) it
/// follows the region's policy; the range must then stay inside that region.
///
/// # Errors
/// [`Error::Unaligned`], [`Error::Overflow`], [`Error::OutOfReach`] for bad input;
/// [`Error::NotMapped`] for holes; [`Error::Unsupported`] for shared, file-backed or protected
/// memory, for scratch memory ([`ScratchRegion`]: always volatile, it cannot be pinned) and for
/// refill memory ([`RefillRegion`]: its pages are the refill thread's to drop and make);
/// [`Error::Straddles`] for a range crossing a region's boundary; `Error::Os(EUSERS)` in a
/// shared region mapped by as many holders as it has room for ([`VolatileRegion::open_shared`]);
/// [`Error::Refused`] when the kernel refuses the hint (locked memory), in which case every page
/// is pinned again except pages found purged, which keep that state.
///
/// # Safety
/// The caller must own the memory and hold no reference into it that assumes its content is
/// stable: any page may read as zero once marked, until it is unmarked.
///
/// # References
/// madvise(2) MADV_FREE.
pub unsafe fn mark_volatile(ptr: *mut u8, len: usize) -> Result<usize> {
    match target(ptr, len)? {
        Target::Empty => Ok(0),
        // SAFETY: forwarded contract.
        Target::Arbitrary(span) => unsafe { lazy::mark_volatile(span) },
        // SAFETY: forwarded contract.
        Target::Ranges(span, first) => unsafe { mark_ranges(span, first) },
    }
}

/// The classic mark inside a region of ranges, by the region's policy.
///
/// # Safety
/// As [`mark_volatile`]; the span lies in one library-owned region, `first` the range holding
/// its first page.
unsafe fn mark_ranges(span: span::Span, first: managed::First) -> Result<usize> {
    // SAFETY: forwarded contract.
    unsafe { managed::mark_in(first, span)? };
    reclaim::noticed_mark();
    reclaim::catch_up();
    Ok(span.len())
}

/// Pins `[ptr, ptr + len)` again and reports how many of its pages were discarded while
/// volatile (they read as zero). Pages that were not volatile count as intact.
///
/// Exact: a page is reported intact only if its content provably survived, and it can no
/// longer be discarded when this returns. On arbitrary memory and in lazy regions, a page
/// that was all zero when marked is reported intact and left as it is. In managed and hybrid
/// regions a purged range reports all its pages; in a shared region, each page purged since
/// this mapping last pinned it.
///
/// Async-signal-safe for arbitrary memory and every region policy (no allocation, no lock;
/// the only system calls are the range check of arbitrary memory and, for ranges holding whole
/// 2 MiB blocks, one PAGEMAP_SCAN ioctl per 128 MiB). Unmarking a range the
/// reclaimer is purging or arming waits for it (spinning, then yielding).
///
/// # Errors
/// As [`mark_volatile`], except that the kernel is never asked anything that can be refused.
///
/// # Safety
/// The caller must own the memory: pages are written (their witness word, atomically, with
/// the value it holds).
pub unsafe fn unmark(ptr: *mut u8, len: usize) -> Result<Unmarked> {
    match target(ptr, len)? {
        Target::Empty => Ok(Unmarked::default()),
        // SAFETY: forwarded contract.
        Target::Arbitrary(span) => unsafe { lazy::unmark(span) },
        Target::Ranges(span, first) => managed::unmark_in(first, span),
    }
}

/// Marks `[ptr, ptr + len)` volatile in SIGBUS mode: as [`mark_volatile`], and until it is
/// unmarked, touching a page the system discarded raises SIGBUS at that address instead of
/// reading zero (a handler may place content with [`fill`] and return; the access is then
/// retried). Pages never purged, and every page once unmarked, never signal (the mark's scan
/// maps the zero page wherever nothing was ever written, so only discarded pages are missing).
///
/// On arbitrary private anonymous memory and in lazy regions this registers the range with the
/// process's userfaultfd (one more system call); in a managed or hybrid region created with
/// [`Options::sigbus`] it is the region's O(1) mark. See the semantics table in the README.
///
/// # Errors
/// As [`mark_volatile`]; `Error::Os(ENOTSUP)` without userfaultfd (or its SIGBUS feature, or
/// the permission to use it); `Error::Os(EAGAIN)` if the process's userfaultfd had to be opened
/// while 0, 1 or 2 was closed (try again); [`Error::BadFlags`] in a region created without
/// SIGBUS mode.
///
/// # Safety
/// As [`mark_volatile`]; and the process must be ready for SIGBUS: without a handler, touching a
/// purged page kills it.
///
/// # References
/// userfaultfd(2) (UFFD_FEATURE_SIGBUS), madvise(2) MADV_FREE.
pub unsafe fn mark_volatile_sigbus(ptr: *mut u8, len: usize) -> Result<usize> {
    match target(ptr, len)? {
        Target::Empty => Ok(0),
        Target::Arbitrary(span) => {
            // SAFETY: forwarded contract.
            unsafe { lazy::mark_volatile_sigbus(span) }
        }
        Target::Ranges(_, (_, first)) if !first.sigbus() => Err(Error::BadFlags),
        // SAFETY: forwarded contract.
        Target::Ranges(span, first) => unsafe { mark_ranges(span, first) },
    }
}

/// Places `len` bytes from `src` into the purged pages of `[dst, dst + len)` of SIGBUS-mode
/// memory (or of a [`RefillRegion`] whose fill failed), atomically per
/// page, leaving pages that are present as they are. Async-signal-safe:
/// a SIGBUS handler calls it for the faulting page and returns, and the access is retried.
///
/// # Errors
/// [`Error::Unaligned`] unless `dst` and `len` are page multiples; [`Error::NotRegion`] where
/// `dst` is not SIGBUS-mode memory that is volatile (or the descriptor was closed by the
/// program); `Error::Os(ENOMEM)` when memory for the pages cannot be charged.
///
/// # Safety
/// `src` must be readable for `len` bytes; `[dst, dst + len)` must be memory the caller owns.
pub unsafe fn fill(dst: *mut u8, src: *const u8, len: usize) -> Result<()> {
    // SIGBUS-mode memory, or a refill region whose fill failed.
    let fds = [sigbus::current(), refill::current()];
    // SAFETY: forwarded contract.
    unsafe { sigbus::fill_into(fds, dst, src, len) }
}

impl RefillRegion {
    /// Maps a refill region of `len` bytes (rounded up to a page) in blocks of `block` bytes
    /// (a page multiple; the last block may be shorter), whose content `fill(offset, buf)`
    /// writes into `buf` (`buf.len()` bytes of the block at `offset`), returning whether it
    /// could. Nothing is filled until touched.
    ///
    /// # Errors
    /// [`Error::NotRegion`] for a zero length; [`Error::Unaligned`] for a block that is not a
    /// page multiple; [`Error::Overflow`]; `Error::Os(ENOTSUP)` without userfaultfd (or the
    /// permission to use it); `Error::Os(EAGAIN)` if its userfaultfd had to be opened while 0, 1
    /// or 2 was closed (try again); `Error::Os(ENOMEM)` and other errnos of mmap(2) and the
    /// thread's creation.
    pub fn new(
        len: usize,
        block: usize,
        fill: impl FnMut(usize, &mut [u8]) -> bool + Send + 'static,
    ) -> Result<RefillRegion> {
        RefillRegion::create(len, block, fill)
    }

    /// As [`RefillRegion::new`], but each block is filled on the thread that touches it, in
    /// vrange's SIGBUS handler, instead of by the refill thread: no thread wakes another, so a
    /// fault costs the signal, the fill and the install. The first such region installs that
    /// handler for the process, in front of the program's SIGBUS action, to which every other
    /// SIGBUS goes (and a failing fill's, with `si_addr` the address touched: a handler may
    /// place the page with [`fill`] and return).
    ///
    /// `fill` runs inside a signal handler at the instruction that touched the region, on
    /// several threads at once: it must not touch a refill region (SIGBUS is blocked there: the
    /// process would die), and it may allocate or take a lock only if the code touching the
    /// region never holds it while doing so. A program that installs a SIGBUS handler of its
    /// own after this must pass the signals it does not handle on to the one it replaced, as
    /// vrange does. Near the memory cgroup's limit these fills do not first give back the
    /// region's oldest blocks (the refill thread's do); the kernel takes the lazy-free blocks.
    ///
    /// # Errors
    /// As [`RefillRegion::new`] (ENOTSUP without userfaultfd's SIGBUS feature);
    /// `Error::Os(ENOMEM)` when [`MAX_FILLED_HERE_REGIONS`] such regions live already.
    pub fn filled_here(
        len: usize,
        block: usize,
        fill: impl Fn(usize, &mut [u8]) -> bool + Send + Sync + 'static,
    ) -> Result<RefillRegion> {
        RefillRegion::create_here(len, block, Box::new(fill))
    }
}

/// Purges up to `bytes` bytes of volatile managed ranges now, lowest class and least recently
/// used first, whole ranges at a time (so it may free more than asked). Returns the bytes
/// freed: the lengths of the ranges purged. Runs in the caller's thread.
pub fn purge(bytes: usize) -> usize {
    reclaim::purge(bytes)
}

/// Frees the library-owned region, of any kind (a [`VolatileRegion`], [`ScratchRegion`] or
/// [`RefillRegion`] given up with `into_raw`), that `ptr` and `len` name exactly (`len`
/// rounded up to a page): what the C `vrange_free` does. One lookup in the region table.
///
/// # Errors
/// [`Error::NotRegion`] if they name no region; [`Error::Unaligned`] and the like for bad
/// input.
///
/// # Safety
/// The caller owns the region and gives it up: nothing may use it afterwards.
pub unsafe fn free_region(ptr: *mut u8, len: usize) -> Result<()> {
    let span = span::Span::new(ptr as usize, len)?;
    let exact = |extent: (usize, usize)| extent == (span.start, span.len());
    // The handle of the region found is made from the lookup (which checked its kind) and
    // dropped: the caller owns the region and gives it up.
    match regions::find(span).ok().flatten() {
        Some(regions::Owner::Ranges(_, first)) if exact(first.region()) => {
            drop(VolatileRegion::at(span.start, span.len()))
        }
        Some(regions::Owner::Extent(entry, kind)) if entry.extent().is_some_and(exact) => {
            match kind {
                extents::Kind::Scratch => drop(ScratchRegion::adopt(span.start, span.len())),
                extents::Kind::Refill | extents::Kind::RefillHere => drop(RefillRegion::adopt(
                    span.start,
                    span.len(),
                    kind == extents::Kind::RefillHere,
                )),
            }
        }
        _ => return Err(Error::NotRegion),
    }
    Ok(())
}

/// Sets the reclaim class of `[ptr, ptr + len)`, inside one library-owned region of ranges
/// (a [`VolatileRegion`] or `vrange_alloc` memory; ranges are split at the span's ends as
/// marking splits them): what the C `vrange_set_priority` does. One lookup in the region table.
///
/// # Errors
/// [`Error::NotRegion`] for memory no region of ranges holds (scratch and refill regions have
/// no class); [`Error::NotMapped`] for a range past the end of its region;
/// [`Error::Partial`] for part of a shared region; [`Error::Unaligned`] and the like for bad
/// input.
pub fn set_priority(ptr: *mut u8, len: usize, priority: Priority) -> Result<()> {
    match target(ptr, len) {
        Ok(Target::Empty) => Ok(()),
        Ok(Target::Ranges(span, first)) => managed::set_priority_in(first, span, priority),
        Ok(Target::Arbitrary(_)) | Err(Error::Unsupported) => Err(Error::NotRegion),
        // Starting inside a region: past its end, as for a region's own offsets.
        Err(Error::Straddles) if regions::containing(ptr as usize).is_some() => {
            Err(Error::NotMapped)
        }
        Err(Error::Straddles) => Err(Error::NotRegion),
        Err(e) => Err(e),
    }
}

/// The memfd of the shared region holding `addr` (see [`VolatileRegion::shared_fd`]), valid
/// until the region is freed: what the C `vrange_shared_fd` returns. One lookup in the region
/// table.
pub fn shared_fd_at(addr: *const u8) -> Option<std::os::fd::RawFd> {
    use std::os::fd::AsRawFd;
    managed::shared_fd(addr as usize).map(|fd| fd.as_raw_fd())
}

/// The classic call: marks or unmarks, returning the bytes processed and, for
/// [`Mode::NoVolatile`], what was purged.
///
/// # Errors
/// See [`mark_volatile`] and [`unmark`].
///
/// # Safety
/// See [`mark_volatile`] and [`unmark`].
pub unsafe fn vrange(start: *mut u8, len: usize, mode: Mode) -> Result<(usize, Unmarked)> {
    match mode {
        // SAFETY: forwarded contract.
        Mode::Volatile => unsafe { mark_volatile(start, len) }.map(|n| (n, Unmarked::default())),
        Mode::VolatileSigbus => {
            // SAFETY: forwarded contract.
            unsafe { mark_volatile_sigbus(start, len) }.map(|n| (n, Unmarked::default()))
        }
        // SAFETY: forwarded contract.
        Mode::NoVolatile => unsafe { unmark(start, len) }.map(|u| (u.pages * page_size(), u)),
    }
}
