//! The registry of managed ranges: a slot per range in an arena that only grows, and an owner
//! map from every page of a library-owned region to the slot of the range holding it.
//!
//! Lookups (`owner_of`, `slot`) never allocate or lock. Creating and freeing slots takes a short
//! spin lock (the free list), also held across `fork` so a child never inherits it locked. Slots
//! are recycled but never unmapped, so a reclaimer holding a stale index reads a valid slot; the
//! state word's generation keeps it from acting on a recycled one.

use crate::page_index::PageIndex;
use crate::shared::{Header, Table};
use crate::slots::{Arena, Linked, NONE};
use crate::state::RangeState;
use crate::Error;
use std::ptr::null_mut;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicUsize};
use vrange_sys::fd::GuestFd;
use vrange_sys::lock::{Lock, Rank};
use vrange_sys::mem;

/// How a region's volatile ranges are purged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// The kernel path: MADV_FREE at every mark, the kernel alone decides what to drop, and
    /// unmark proves each page with its witness word.
    Lazy,
    /// Mark and unmark are one atomic operation on the range; pages stay resident until the
    /// reclaimer purges the whole range.
    Managed,
    /// Managed, and a range left volatile longer than the arm delay is handed to the kernel
    /// path so direct reclaim can drop it even if the reclaimer reacts too late.
    #[default]
    Hybrid,
}

/// Which ranges the reclaimer drops first. Within a class the least recently used goes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Priority {
    /// Drop before anything else (cheap to regenerate).
    DropFirst = 0,
    /// Drop before normal ranges.
    Low = 1,
    /// The default.
    #[default]
    Normal = 2,
    /// Drop only when nothing else is left (expensive to regenerate).
    DropLast = 3,
}

impl Priority {
    pub(crate) fn from_bits(bits: u32) -> Priority {
        match bits & 3 {
            0 => Priority::DropFirst,
            1 => Priority::Low,
            2 => Priority::Normal,
            _ => Priority::DropLast,
        }
    }
}

const LIVE: u32 = 1;
const POLICY_SHIFT: u32 = 1;
const PRIORITY_SHIFT: u32 = 4;
/// The range belongs to a SIGBUS-mode region (see `sigbus`).
const SIGBUS: u32 = 1 << 3;
/// The THP advice its owner gave the memory (0: not known; else `THP_HUGE` or `THP_SMALL`).
const THP_SHIFT: u32 = 6;
const THP_HUGE: u32 = 1;
const THP_SMALL: u32 = 2;

/// One managed range. Its extent changes only while its owner has claimed it (`BUSY`).
/// Cache-line aligned: threads marking and unmarking different ranges (an allocator's arenas)
/// must not share a line.
#[derive(Debug)]
#[repr(align(64))]
pub(crate) struct Slot {
    /// The state of a private range (a shared region's pages have theirs in its file, and
    /// this word stays `PINNED`: scans that do not look at shared regions skip them).
    state: RangeState,
    /// CLOCK_MONOTONIC ns of the last mark: the age the reclaimer sorts by.
    last_used: AtomicU64,
    pub start: AtomicUsize,
    pub len: AtomicUsize,
    /// Bytes from `start` handed to the kernel path while `ARMING`/`ARMED`.
    pub armed: AtomicUsize,
    info: AtomicU32,
    next_free: AtomicU32,
    /// The region the range belongs to (copied into every range split off it).
    pub region_start: AtomicUsize,
    pub region_len: AtomicUsize,
    /// Shared regions: the header in the shared mapping, the memfd, and the holder number
    /// this mapping pins pages as (plus one; 0: none yet).
    pub header: AtomicPtr<Header>,
    /// Owned (`Box::into_raw`) by the slot that maps the region; null otherwise.
    pub fd: AtomicPtr<GuestFd>,
    pub holder: AtomicU32,
    /// Marked again within `approach::HOT` of its previous mark (a range in use: a cache's
    /// slab between hits): while memory is tight it is armed only once idle that long
    /// (`crate::approach`).
    pub hot: AtomicBool,
}

impl Slot {
    /// The state word of a private range.
    pub fn state(&self) -> &RangeState {
        &self.state
    }

    /// The header of a shared region (its pages' states live there, in the region's
    /// mapping). Freeing a shared region unmaps it under the purge lock ([`pause`]), so
    /// a thread other than the region's owner (a scan over [`for_each_live`]) reads it only
    /// under that lock.
    pub fn header(&self) -> Option<Table<'_>> {
        let h = self.header.load(Acquire);
        // SAFETY: a non-null header points into the region's shared mapping (the table of
        // `region_len` bytes of data, as checked when it was mapped, then the data), which
        // stays mapped until the region is freed; its owner does not free it while using it,
        // and others read it under the purge lock, which freeing a shared region takes (see
        // above). The slot was filled before the header was published (Release, read Acquire).
        unsafe {
            let h = h.as_ref()?;
            Some(Table::new(h, self.region_len.load(Relaxed)))
        }
    }

    pub fn last_used(&self) -> u64 {
        self.last_used.load(Relaxed)
    }

    pub fn touch(&self, now: u64) {
        self.last_used.store(now, Relaxed);
    }

    /// The inode of a shared region's file (0 for a private range). Under the purge lock, as
    /// [`Slot::header`]: freeing the region drops the descriptor under it.
    pub fn shared_ino(&self) -> u64 {
        // SAFETY: the slot owns the box until the region is freed, under the purge lock the
        // caller holds (or the caller owns the region).
        unsafe { self.fd.load(Relaxed).as_ref() }.map_or(0, |g| g.ident().ino())
    }

    pub fn is_live(&self) -> bool {
        self.info.load(Acquire) & LIVE != 0
    }

    pub fn policy(&self) -> Policy {
        match (self.info.load(Relaxed) >> POLICY_SHIFT) & 3 {
            0 => Policy::Lazy,
            1 => Policy::Managed,
            _ => Policy::Hybrid,
        }
    }

    pub fn set_policy(&self, p: Policy) {
        let bits = match p {
            Policy::Lazy => 0,
            Policy::Managed => 1,
            Policy::Hybrid => 2,
        };
        let _ = self.info.fetch_update(Release, Relaxed, |i| {
            Some((i & !(3 << POLICY_SHIFT)) | (bits << POLICY_SHIFT))
        });
    }

    /// Whether the range belongs to a SIGBUS-mode region (copied into ranges split off it).
    pub fn sigbus(&self) -> bool {
        self.info.load(Relaxed) & SIGBUS != 0
    }

    /// Makes the (unpublished) range's region SIGBUS-mode.
    pub fn set_sigbus(&self) {
        self.info.fetch_or(SIGBUS, Relaxed);
    }

    /// The THP advice of the range's memory (MADV_HUGEPAGE: `Some(true)`), if its owner said.
    pub fn thp_advice(&self) -> Option<bool> {
        match (self.info.load(Relaxed) >> THP_SHIFT) & 3 {
            THP_HUGE => Some(true),
            THP_SMALL => Some(false),
            _ => None,
        }
    }

    /// Records the THP advice the range's memory was given (copied into ranges split off it).
    pub fn set_thp_advice(&self, huge: bool) {
        let bits = if huge { THP_HUGE } else { THP_SMALL };
        let _ = self.info.fetch_update(Release, Relaxed, |i| {
            Some((i & !(3 << THP_SHIFT)) | (bits << THP_SHIFT))
        });
    }

    pub fn priority(&self) -> Priority {
        Priority::from_bits(self.info.load(Relaxed) >> PRIORITY_SHIFT)
    }

    pub fn set_priority(&self, p: Priority) {
        let _ = self.info.fetch_update(Release, Relaxed, |i| {
            Some((i & !(3 << PRIORITY_SHIFT)) | ((p as u32) << PRIORITY_SHIFT))
        });
    }

    pub fn extent(&self) -> (usize, usize) {
        (self.start.load(Acquire), self.len.load(Acquire))
    }

    /// The start and length of the region this range belongs to.
    pub fn region(&self) -> (usize, usize) {
        (
            self.region_start.load(Relaxed),
            self.region_len.load(Relaxed),
        )
    }

    /// Fills a fresh (unpublished) slot.
    pub fn init(&self, policy: Policy, priority: Priority, start: usize, len: usize) {
        self.state.reset();
        self.last_used.store(0, Relaxed);
        self.start.store(start, Relaxed);
        self.len.store(len, Relaxed);
        self.armed.store(0, Relaxed);
        self.region_start.store(start, Relaxed);
        self.region_len.store(len, Relaxed);
        self.header.store(null_mut(), Relaxed);
        self.fd.store(null_mut(), Relaxed);
        self.holder.store(0, Relaxed);
        self.hot.store(false, Relaxed);
        self.info
            .store((priority as u32) << PRIORITY_SHIFT, Relaxed);
        self.set_policy(policy);
    }

    /// Copies the region-wide fields of `from` into a fresh slot split off it, in state `word`.
    pub fn init_split(&self, from: &Slot, word: u64, start: usize, len: usize, armed: usize) {
        self.state.reset_to(word);
        self.last_used.store(from.last_used.load(Relaxed), Relaxed);
        self.hot.store(from.hot.load(Relaxed), Relaxed);
        self.start.store(start, Relaxed);
        self.len.store(len, Relaxed);
        self.armed.store(armed, Relaxed);
        self.region_start
            .store(from.region_start.load(Relaxed), Relaxed);
        self.region_len
            .store(from.region_len.load(Relaxed), Relaxed);
        self.header.store(null_mut(), Relaxed);
        self.fd.store(null_mut(), Relaxed);
        self.holder.store(0, Relaxed);
        self.info.store(from.info.load(Relaxed) & !LIVE, Relaxed);
    }

    /// Makes an initialised slot visible to the reclaimer.
    fn publish(&self) {
        self.info.fetch_or(LIVE, Release);
    }

    fn retire(&self) {
        self.info.fetch_and(!LIVE, Release);
    }
}

impl Linked for Slot {
    fn next_free(&self) -> &AtomicU32 {
        &self.next_free
    }
}

const CHUNK_SHIFT: u32 = 12;
const MAX_CHUNKS: usize = 1024;

static CHUNKS: [AtomicPtr<Slot>; MAX_CHUNKS] = [const { AtomicPtr::new(null_mut()) }; MAX_CHUNKS];
/// Slot indices start at 1 so that 0 can mean "none"; `HIGH` is one past the highest used.
static HIGH: AtomicU32 = AtomicU32::new(1);
static FREE_HEAD: AtomicU32 = AtomicU32::new(NONE);
pub(crate) static LOCK: Lock = Lock::with_child_hook(Rank::Registry, Some(after_fork_child));
/// Page → slot index of the range holding it (0: not a managed page).
static OWNERS: PageIndex<AtomicU32> = PageIndex::new();

/// The slot arena (`crate::slots`): chunks are fresh zeroed mappings, and zero-filled memory
/// is a valid `Slot` (atomics and null pointers).
fn arena() -> Arena<'static, Slot> {
    Arena {
        chunks: &CHUNKS,
        chunk_shift: CHUNK_SHIFT,
        high: &HIGH,
        free_head: &FREE_HEAD,
        new_chunk: |slots| {
            let bytes = slots * std::mem::size_of::<Slot>();
            let page = mem::page_size();
            let fresh = mem::map_anon(bytes.div_ceil(page) * page, page).ok()?;
            Some(fresh.as_ptr().cast())
        },
    }
}

/// The slot with index `idx` (which must have been returned by [`alloc_slot`]).
#[inline]
pub(crate) fn slot(idx: u32) -> &'static Slot {
    arena().get(idx)
}

/// Takes a free slot, not yet live: fill it, then [`NewSlot::publish`]. Dropped unpublished
/// (an error on the way), it goes back to the free list.
pub(crate) fn alloc_slot() -> Result<NewSlot, Error> {
    let idx = LOCK
        .with(|| arena().alloc_locked())
        .map_err(|_| Error::Os(libc::ENOMEM))?;
    Ok(NewSlot {
        idx,
        slot: slot(idx),
    })
}

/// A slot taken by [`alloc_slot`] and not yet published (see there).
pub(crate) struct NewSlot {
    idx: u32,
    slot: &'static Slot,
}

impl NewSlot {
    pub(crate) fn idx(&self) -> u32 {
        self.idx
    }

    pub(crate) fn slot(&self) -> &'static Slot {
        self.slot
    }

    /// Makes the slot live ([`Slot::publish`]) and keeps it; returns its index.
    pub(crate) fn publish(self) -> u32 {
        self.slot.publish();
        let idx = self.idx;
        std::mem::forget(self);
        idx
    }
}

impl Drop for NewSlot {
    fn drop(&mut self) {
        free_slot(self.idx);
    }
}

/// Held while purging, so that purges do not overlap, and while scanning shared ranges' state
/// (see [`Slot::header`]): freeing a shared region takes it before unmapping the header. Held
/// across fork (`vrange_sys::lock`).
pub(crate) static PURGES: Lock = Lock::new(Rank::Purges);

/// Holds off purging (by the reclaimer or an explicit purge) while alive.
pub(crate) type Paused = vrange_sys::lock::Guard<'static>;

/// Holds off purging, and the freeing of shared regions, until the guard drops.
pub(crate) fn pause() -> Paused {
    PURGES.lock()
}

/// How many slots have ever been handed out (live or free): a bound on a scan's results.
pub(crate) fn slots() -> usize {
    arena().high() as usize
}

/// Returns a slot to the free list, retiring it first (a scan skips it from then on).
pub(crate) fn free_slot(idx: u32) {
    slot(idx).retire();
    LOCK.with(|| arena().free_locked(idx));
}

/// In a fork child (under the lock): the parent's pins on shared regions are the parent's,
/// under its holder numbers; the child's inherited mappings hold none, like fresh mappings,
/// and claim numbers of their own at their first unmark.
fn after_fork_child() {
    for_each_live(|_, slot| {
        if slot.header().is_some() {
            slot.holder.store(0, Relaxed);
        }
    });
}

/// Calls `f` for every live slot. The slots may change under `f`: it must re-check state. A
/// scan that reads shared ranges' state ([`Slot::header`]) holds the purge lock.
pub(crate) fn for_each_live(mut f: impl FnMut(u32, &'static Slot)) {
    arena().for_each(|idx, s| {
        if s.is_live() {
            f(idx, s);
        }
    });
}

/// The range holding the page at `addr`, if it belongs to a library-owned region.
/// Async-signal-safe.
pub(crate) fn owner_of(addr: usize) -> Option<(u32, &'static Slot)> {
    let idx = OWNERS.get(addr)?.load(Acquire);
    (idx != NONE).then(|| (idx, slot(idx)))
}

/// Records slot `idx` as the owner of every page of `[start, end)`.
pub(crate) fn set_owner(start: usize, end: usize, idx: u32) -> Result<(), Error> {
    OWNERS.for_each(start, end, true, |_, e| e.store(idx, Release))
}

/// Forgets the owner of every page of `[start, end)`.
pub(crate) fn clear_owner(start: usize, end: usize) {
    let _ = OWNERS.for_each(start, end, false, |_, e| e.store(NONE, Release));
}

/// Whether any page of `[start, end)` belongs to a library-owned region.
pub(crate) fn any_owned(start: usize, end: usize) -> bool {
    let mut owned = false;
    let _ = OWNERS.for_each(start, end, false, |_, e| owned |= e.load(Relaxed) != NONE);
    owned
}
