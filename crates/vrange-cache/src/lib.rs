//! A concurrent key → bytes cache whose values live in volatile memory: the system may take
//! them back when memory is short, a value in use is never taken, and a lookup says exactly
//! what happened to a key (there, never there or removed, or purged).
//!
//! Fixed-capacity caches make the operator choose between an OOM kill (capacity too large for
//! the container) and a wasted hit rate (too small). This one has no capacity: it grows while
//! memory is free and gives memory back, least recently used first within priority classes,
//! whenever vrange's reclaimer sees pressure (PSI, cgroup limits, headroom, a budget), in one
//! order with all other vrange memory of the process. It can also keep its own resident budget.
//!
//! ```
//! use vrange::Priority;
//! use vrange_cache::{Cache, Miss};
//!
//! let cache: Cache<String> = Cache::new(Default::default());
//! cache.insert("page:1".into(), b"<html>...</html>", Priority::Normal)?;
//! match cache.lookup("page:1") {
//!     Ok(v) => assert_eq!(&v[..], b"<html>...</html>"), // pinned while `v` lives
//!     Err(Miss::Purged) => { /* the system took it back: render again */ }
//!     Err(Miss::Absent) => { /* never cached, or removed */ }
//! }
//! // Or let the cache call the renderer when needed:
//! let v = cache.get_or_insert_with("page:2".into(), 4, Priority::Low, |buf| {
//!     buf.copy_from_slice(b"page");
//! })?;
//! assert_eq!(&v[..], b"page");
//! # Ok::<(), vrange::Error>(())
//! ```
//!
//! # Storage
//! Values are copied (or written in place by [`Cache::insert_with`]) into *slabs*: vrange
//! regions of [`Options::slab_bytes`] (256 KiB by default), one open slab per priority class
//! (and one for its probation, below) and per shard of the inserting threads (four: threads
//! take them in turn), filled in insertion order and never reused. A slab is pinned while any [`Entry`] of it is
//! held and volatile otherwise; the reclaimer purges whole slabs, so a purge frees every page it
//! claims. Values larger than a quarter of a slab (less 4 KiB) get a region of their own.
//! Each region's values start at a different multiple of 64 bytes below a page (cache
//! colouring). A slab found
//! purged is unmapped at once; its entries stay in the map as tombstones until looked up (the
//! lookup says `Purged` once) or removed. Only when tombstones pile up (more than 65,536 and
//! more than twice the live entries) does a sweep drop them, and lookups of those keys then
//! say `Absent` ([`Stats::dropped_purged`] counts them). Removed or replaced values leave their space in
//! their slab until all of its entries are gone: [`Stats::overhead_bytes`] reports it with
//! page rounding. [`Stats::resident_bytes`] counts only the pages values were written to
//! (an upper bound of what is resident), [`Stats::mapped_bytes`] the slabs' address space,
//! and [`Stats::pinned_bytes`] what readers keep from any purge.
//!
//! # Reading now, keeping for long
//! An [`Entry`] is the guard for reading a value now: it pins the value's whole slab with two
//! atomic operations. A value kept for long is [`Entry::hold`]: a [`Held`] value (as are the
//! C ABI's raw values and Python's views) keeps only the pages it lies on; the rest of its slab
//! becomes volatile around it and may be purged (the slab's other values are then lost, the
//! held one stays readable until dropped).
//!
//! # Pressure
//! Before it maps a new slab, an insert checks the memory cgroup's headroom
//! ([`vrange::reclaimer::make_room`], one `pread`) and purges the oldest volatile memory of
//! the process (under a live coordinator: of the container, in its global order) if the new
//! slab would leave less than the `VRANGE_HEADROOM` threshold free: a cache filling at memory
//! speed must not pass its container's limit between two ticks of the reclaimer. So does a
//! lookup whose hit moves a value off probation (below) when the move needs a new slab: such
//! a lookup may purge, as an insert may.
//!
//! # Eviction: whole slabs, chosen per value
//! The cache's own evictions (its budget, and recycling below) take whole slabs: lowest class
//! first (probation a class below its own, but kept at about 3 % of its class), then the
//! oldest made. Before a slab goes, the values read since they were written (or last carried)
//! are copied into a *merge slab* of their class, up to 15/16 of a slab (half while
//! recycling, which a miss waits for), the most read first,
//! after Segcache (NSDI '21): what stays is chosen per value while the memory freed is a whole
//! slab. Each entry counts its reads in two bits; a carry takes one off, so a value must keep
//! being read to keep being carried ([`ClassStats::carried`] counts them). The kernel's and the
//! reclaimer's purges under pressure carry nothing: they take whole slabs, by how long each
//! was idle, in one order with all other vrange memory of the process.
//!
//! # Recycling
//! While memory is short (a new slab would leave the memory cgroup less free than that
//! threshold), a new slab is not mapped: it takes over the pages of the slab the cache's own
//! eviction would take first (its read values carried out first), whose other entries then
//! read as purged ([`ClassStats::recycled`] counts such slabs).
//! The pages are resident already: no fault, no zeroing, no new charge to the cgroup, where
//! purging the old slab and faulting a new one in would do all three. The cache gives memory
//! back to the system only when someone else needs it: vrange's reclaimer still purges its
//! volatile slabs on pressure, in one order with all other vrange memory of the process.
//!
//! A slab whose entries are all gone (removed, replaced, or its cache dropped) leaves its
//! region to a pool shared by every cache of the process, for the next slab or large value of
//! its length: at most 128 MiB of written pages, volatile in the lowest class (`DropFirst`),
//! so any purge takes it before a value. A dropped cache's memory thus stays resident until
//! reused or purged, as an allocator keeps what it freed.
//!
//! # Hits, and when a released slab becomes volatile
//! A hit costs a map lookup and two atomic operations on its slab: a slab stays pinned on the
//! cache's behalf after its last reader lets go, until the next *flush*, which marks every such
//! idle slab volatile in the order they went idle. vrange's reclaimer flushes at each tick
//! (`VRANGE_POLL_MS`, 100 ms) and before every purge ([`vrange::reclaimer::on_flush`]), and so
//! does the cache before it maps a slab: memory is never kept from a purge that should take
//! it, it only becomes volatile up to a tick later than its last use.
//!
//! # Age
//! For the reclaimer, a slab's age is the time it was flushed after its last use: a hit on one
//! entry renews the whole slab. For the cache's own evictions it is the time since the slab was
//! made, and a read value survives by being carried (above).
//!
//! # Probation: scans do not flush the cache
//! LRU at slab grain alone lets a scan (keys requested once) push out the values being read.
//! So, after S3-FIFO ([`Options::probation`], on by default): a key's first value goes into a
//! *probation* slab, whose region vrange purges as one class below the value's (`Normal`
//! values on probation go with `Low` memory of the process, by age; `DropFirst` has no class
//! below, so there it orders by age alone). A value's first hit moves it (one copy, on the
//! reading thread) into an ordinary slab of its class; its space in the probation slab is
//! given up. A probation value purged unread and then requested again (the lookup that
//! says [`Miss::Purged`]) marks its key, and the key's next insert skips probation: a
//! value wanted twice is kept as one that was read. Values large enough for a region of
//! their own are never on probation. [`ClassStats::promoted`] counts the moves.

#![deny(unsafe_op_in_unsafe_fn)]

mod counters;
mod entry;
mod lock;
mod merge;
mod pool;
mod probation;
mod recycle;
mod slab;

pub use counters::{ClassStats, Stats};
pub use entry::{Entry, Held};
pub use vrange::{Error, Policy, Priority, Result};

use crate::lock::Mutex;
use counters::{class, CLASSES};
use crossbeam_utils::CachePadded;
use dashmap::DashMap;
use slab::{Shared, Slab};
use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Weak};
use vrange_sys::lock::Rank;

/// Open slabs per class: inserting threads are spread over this many (see [`shard`]).
const SHARDS: usize = 4;

/// This thread's shard of the open slabs: threads take shards in turn as they first insert.
/// Written by hand: a thread-local index, no allocation, no lock.
fn shard() -> usize {
    use std::cell::Cell;
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local!(static SHARD: Cell<usize> = const { Cell::new(usize::MAX) });
    SHARD.with(|s| {
        if s.get() == usize::MAX {
            s.set(NEXT.fetch_add(1, Relaxed) % SHARDS);
        }
        s.get()
    })
}

/// Why a lookup returned no value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Miss {
    /// Never inserted, removed, or purged and already reported.
    Absent,
    /// The system purged the value under memory pressure; the entry is now dropped.
    Purged,
}

/// How a cache stores its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Bytes per slab (rounded up to a page; at least 64 KiB, at most [`MAX_SLAB_BYTES`]:
    /// [`Cache::try_new`] refuses more). Smaller slabs purge at a finer grain; larger ones
    /// cost fewer regions.
    pub slab_bytes: usize,
    /// How slabs are purged (default [`Policy::Hybrid`]: the reclaimer purges them, and one
    /// left volatile for the arm delay is also handed to the kernel's lazy-free path). A lazy
    /// policy is taken as hybrid: a slab must be purged whole.
    pub policy: Policy,
    /// Resident bytes (as [`Stats::resident_bytes`] counts them) this cache keeps at most:
    /// past it, an insert evicts the cache's own slabs (see "Eviction": whole slabs, their
    /// read values carried) down to 15/16 of it, or to four slabs below it if that is closer. `None`: no budget of its own (the process's reclaimer still purges on
    /// pressure and on `VRANGE_BUDGET`).
    pub budget: Option<usize>,
    /// Scan resistance (default on): a key's first value waits on probation, purged before
    /// every value of its class that was read, until its first hit (see "Probation" above).
    /// Off: one LRU order at slab grain within each class.
    pub probation: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            slab_bytes: 256 << 10,
            policy: Policy::Hybrid,
            budget: None,
            probation: true,
        }
    }
}

/// The largest colour (see `Cache::colour`).
const MAX_COLOUR: usize = 63 * 64;
/// The largest region the cache asks for: sizes above it cannot be mapped, and staying far
/// below `usize::MAX` keeps page rounding from overflowing.
const MAX_REGION: usize = MAX_SLAB_BYTES;
/// Alignment of values inside a slab.
const ALIGN: usize = 16;
const MIN_SLAB: usize = 64 << 10;
/// The largest [`Options::slab_bytes`]: 128 TiB, the whole user address space of x86-64 and
/// arm64 with 48-bit addresses (Linux maps nothing above it unless asked for a higher hint).
/// A cache refuses a larger slab at creation rather than failing every insert.
pub const MAX_SLAB_BYTES: usize = 1 << 47;
/// Tombstones (purged entries not yet looked up: a map entry and a share of a small slab
/// record, about 100 bytes each) kept before a sweep drops those of the older half of the dead
/// slabs: this many, or as many as the live entries if more. A tombstone of a probation value
/// is S3-FIFO's ghost: its lookup sends the key's next insert past probation.
const MIN_TOMBSTONES: u64 = 1 << 16;

struct Slot {
    slab: Arc<Slab>,
    off: usize,
    /// The value's length (at most `MAX_REGION`, below [`merge::HITS_SHIFT`]) and, above it,
    /// its reads since it was written or last carried (`crate::merge`): one word, so that a
    /// map entry keeps to 32 bytes (a separate byte made hits 3-7 % slower).
    len_hits: AtomicUsize,
}

impl Slot {
    fn new(slab: Arc<Slab>, off: usize, len: usize) -> Slot {
        Slot::with_hits(slab, off, len, 0)
    }

    /// The value's length.
    fn len(&self) -> usize {
        self.len_hits.load(Relaxed) & merge::LEN_MASK
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slab.entry_gone(self.len());
    }
}

/// Starts loading the cache line at `addr` (a value's first bytes) so that its miss overlaps
/// the pin's atomic operations instead of following them: a hit's reader nearly always reads
/// the value next. A hint only; the address need not be mapped.
#[inline(always)]
fn prefetch(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 (SSE, always present on x86-64) never faults and changes no state a
    // program can observe, whatever the address. (Safe to call in newer Rust: hence the allow.)
    #[allow(unused_unsafe)]
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(addr as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = addr;
}

struct Open {
    slab: Arc<Slab>,
    used: usize,
}

impl Open {
    /// The offset of `need` more bytes (at most a slab: no overflow), the slab pinned for
    /// them; `None` if they do not fit or the slab was purged.
    fn append(&mut self, need: usize) -> Option<(Arc<Slab>, usize)> {
        let end = self.used + need;
        if end <= self.slab.len() && self.slab.pin().is_ok() {
            let off = std::mem::replace(&mut self.used, end);
            return Some((self.slab.clone(), off));
        }
        None
    }
}

type Map<K> = DashMap<K, Slot, foldhash::fast::RandomState>;

/// The cache. Share it between threads by reference or `Arc`.
pub struct Cache<K: Hash + Eq> {
    map: Map<K>,
    /// The open slabs: for each class, and each class's probation, one per thread shard
    /// (`Cache::open_slab`), so that threads inserting at once do not queue on one lock.
    open: Box<[CachePadded<Mutex<Option<Open>>>]>,
    ghosts: probation::Ghosts,
    /// Every slab, by start address: for sweeps, the budget, recycling, statistics and raw
    /// releases.
    slabs: DashMap<usize, Weak<Slab>, foldhash::fast::RandomState>,
    candidates: recycle::Candidates,
    shared: Arc<Shared>,
    opts: Options,
    opened: AtomicUsize,
    colours: AtomicUsize,
    /// The cache's own evictions: one at a time, with their merge slabs (`crate::merge`).
    budget_lock: Mutex<merge::Merge>,
}

impl<K: Hash + Eq> std::fmt::Debug for Cache<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("entries", &self.map.len())
            .field("opts", &self.opts)
            .finish()
    }
}

/// A value's place, pinned; dropped without `commit` it gives the space up.
struct Placed {
    slab: Arc<Slab>,
    off: usize,
    len: usize,
    committed: bool,
}

impl Placed {
    fn buf(&mut self) -> &mut [u8] {
        // SAFETY: the place lies inside the slab, which this guard holds pinned; it was handed
        // to this guard alone (the slab never reuses space).
        unsafe { std::slice::from_raw_parts_mut(self.slab.at(self.off), self.len) }
    }

    fn into_entry(mut self) -> Entry {
        self.committed = true;
        // SAFETY: as in `buf`; the pin moves to the entry.
        let ptr = unsafe { self.slab.at(self.off) };
        Entry::pinned(&self.slab, ptr, self.len)
    }
}

impl Drop for Placed {
    fn drop(&mut self) {
        if !self.committed {
            self.slab.entry_gone(self.len);
            self.slab.unpin();
        }
    }
}

impl<K: Hash + Eq> Drop for Cache<K> {
    fn drop(&mut self) {
        // Entries first, then release the slabs no reader holds (held ones go at their
        // readers' last drop and the next flush).
        self.map.clear();
        for o in &self.open {
            o.lock().take();
        }
        self.shared.flush_idle();
    }
}

impl<K: Hash + Eq + Send + Sync + 'static> Cache<K> {
    /// An empty cache.
    ///
    /// # Panics
    /// If [`Options::slab_bytes`] is impossible (see [`Cache::try_new`]).
    pub fn new(opts: Options) -> Cache<K> {
        match Cache::try_new(opts) {
            Ok(c) => c,
            Err(e) => panic!(
                "vrange_cache::Cache::new: slab_bytes {}: {e}",
                opts.slab_bytes
            ),
        }
    }

    /// An empty cache, or why the options are impossible.
    ///
    /// # Errors
    /// [`Error::Overflow`] (EINVAL in the C ABI) if [`Options::slab_bytes`] is larger than
    /// [`MAX_SLAB_BYTES`]: no process can map such a slab, so every insert would fail.
    pub fn try_new(opts: Options) -> Result<Cache<K>> {
        if opts.slab_bytes > MAX_SLAB_BYTES {
            return Err(Error::Overflow);
        }
        let page = vrange::page_size();
        // At most MAX_SLAB_BYTES (a page multiple): rounding up cannot overflow.
        let opts = Options {
            slab_bytes: opts.slab_bytes.max(MIN_SLAB).next_multiple_of(page),
            policy: match opts.policy {
                Policy::Lazy => Policy::Hybrid,
                p => p,
            },
            ..opts
        };
        let shared = Shared::new();
        Ok(Cache {
            map: Map::default(),
            open: (0..2 * CLASSES * SHARDS)
                .map(|_| CachePadded::new(Mutex::new(Rank::CacheOpen, None)))
                .collect(),
            ghosts: probation::Ghosts::default(),
            slabs: DashMap::default(),
            candidates: recycle::Candidates::default(),
            shared,
            opts,
            opened: AtomicUsize::new(0),
            colours: AtomicUsize::new(0),
            budget_lock: Mutex::new(Rank::CacheBudget, merge::Merge::default()),
        })
    }

    /// The options in force (slab size rounded).
    pub fn options(&self) -> Options {
        self.opts
    }

    fn region_opts(&self, priority: Priority) -> vrange::Options {
        vrange::Options {
            policy: self.opts.policy,
            priority,
            ..vrange::Options::default()
        }
    }

    fn register(&self, slab: &Arc<Slab>) {
        self.slabs.insert(slab.start(), Arc::downgrade(slab));
    }

    /// A pinned place for `len` bytes of class `priority`, in a probation slab if
    /// `probation` (a value of its own region is never on probation: moving it on its first
    /// hit would copy the whole value).
    fn place(&self, len: usize, priority: Priority, probation: bool) -> Result<Placed> {
        // Four values of this size must fit a slab behind the largest colour (slab_bytes is
        // at least MIN_SLAB, far above MAX_COLOUR).
        if len > (self.opts.slab_bytes - MAX_COLOUR) / 4 {
            let c = self.colour();
            // A value too large for the address space is refused before any arithmetic on
            // it can wrap (a wrapped size would map a small region for a huge value).
            let used = len
                .checked_add(c)
                .filter(|&t| t <= MAX_REGION)
                .ok_or(Error::Overflow)?;
            // Rounded up to its class, so that a pooled region of the class fits it (not past
            // the largest region: a value that fits unrounded is not refused for its class).
            let total = pool::class_len(used)
                .filter(|&t| t <= MAX_REGION)
                .unwrap_or(used);
            let slab = self.new_slab(total, used, priority, false)?;
            if slab.len() < total {
                return Err(Error::Overflow); // never: a region is at least as long as asked
            }
            self.register(&slab);
            // The value's pages (up to `used`), not the class's rounded tail.
            return Ok(self.placed_in(slab, c, len));
        }
        // len is at most a quarter of a slab here: none of these sums can overflow.
        let need = len.max(1).next_multiple_of(ALIGN);
        let mut open = self.open_slab(priority, probation).lock();
        if let Some((slab, off)) = open.as_mut().and_then(|o| o.append(need)) {
            return Ok(self.placed_in(slab, off, len));
        }
        // Full, or purged while open: close it.
        open.take();
        let slab = match self.recycled_slab(priority, probation) {
            Some(slab) => slab,
            None => {
                let len = self.opts.slab_bytes;
                let slab = self.new_slab(len, len, priority, probation)?;
                self.register(&slab);
                slab
            }
        };
        let c = self.colour();
        *open = Some(Open {
            slab: slab.clone(),
            used: c + need,
        });
        drop(open);
        self.opened_slab();
        Ok(self.placed_in(slab, c, len))
    }

    /// The place of `len` bytes at `off` in `slab`, which the caller pinned for it.
    fn placed_in(&self, slab: Arc<Slab>, off: usize, len: usize) -> Placed {
        slab.entry_added(len);
        slab.touch(off + len);
        Placed {
            slab,
            off,
            len,
            committed: false,
        }
    }

    /// A new slab of `len` bytes for class `priority`, of which `used` will be written: on a
    /// pooled region if there is one (its resident pages need no room), else on a fresh one.
    /// Before pages the cgroup will be charged for, [`vrange::reclaimer::make_room`] for them
    /// (see "Pressure" above).
    fn new_slab(
        &self,
        len: usize,
        used: usize,
        priority: Priority,
        probation: bool,
    ) -> Result<Arc<Slab>> {
        let opts = self.region_opts(priority);
        if let Some((slab, resident)) = Slab::pooled(len, used, opts, probation, &self.shared) {
            let charged = used.saturating_sub(resident);
            if charged > 0 {
                vrange::reclaimer::make_room(charged);
            }
            return Ok(slab);
        }
        vrange::reclaimer::make_room(used);
        Slab::new(len, opts, probation, &self.shared)
    }

    /// The open slab this thread fills for class `priority` (on probation or not).
    fn open_slab(&self, priority: Priority, probation: bool) -> &Mutex<Option<Open>> {
        &self.open[(class(priority) * 2 + usize::from(probation)) * SHARDS + shard()]
    }

    /// Where the next region's values start: a different multiple of 64 bytes below a page
    /// each time. Without it, the values at one offset of every slab (all the 64 KiB ones, and
    /// every value with a region of its own) share a handful of cache sets and evict each
    /// other: hits on 64 KiB and 1 MiB values cost a quarter to a half more.
    fn colour(&self) -> usize {
        (self.colours.fetch_add(1, Relaxed) % 64) * 64
    }

    fn opened_slab(&self) {
        let n = self.opened.fetch_add(1, Relaxed) + 1;
        if n >= (self.slabs.len() / 8).max(8) {
            self.opened.store(0, Relaxed);
            self.sweep();
        }
    }

    /// Whether an insert of `key` goes on probation: unless probation is off, or the key's
    /// probation value was purged unread and then requested (a ghost).
    fn on_probation<Q: Hash + ?Sized>(&self, key: &Q) -> bool {
        self.opts.probation
            && !(self.ghosts.any() && self.ghosts.take(self.map.hasher().hash_one(key)))
    }

    /// Moves the value of `old` (a hit on `key` in probation slab `slab` at `off`) into an
    /// ordinary slab of its class, unless another thread changed the key meanwhile. Returns
    /// the entry to hand out: the moved value, or `old` if it stays.
    fn promote<Q>(&self, key: &Q, old: Entry, slab: &Arc<Slab>, off: usize) -> Entry
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let Ok(mut p) = self.place(old.len(), slab.priority, false) else {
            return old; // no memory for the move: it stays on probation
        };
        p.buf().copy_from_slice(&old);
        match self.map.get_mut(key) {
            Some(mut s) if Arc::ptr_eq(&s.slab, slab) && s.off == off => {
                // The old slot's drop gives its space in the probation slab up; the new slot
                // takes over the place's count of its slab.
                *s = Slot::new(p.slab.clone(), p.off, p.len);
                drop(s);
                p.slab.record(self.map.hasher().hash_one(key), p.off);
                self.shared.counters.promoted(slab.priority);
                p.into_entry()
            }
            // Replaced, removed or moved by another thread: the place is given up.
            _ => old,
        }
    }

    /// Puts a written value in the map; the slot takes over the place's count of the slab.
    fn commit(&self, key: K, placed: &mut Placed, priority: Priority) {
        if !placed.slab.probation {
            placed
                .slab
                .record(self.map.hasher().hash_one(&key), placed.off);
        }
        let slot = Slot::new(placed.slab.clone(), placed.off, placed.len);
        self.map.insert(key, slot);
        self.shared.counters.inserted(priority);
        if let Some(b) = self.opts.budget {
            if self.shared.counters.resident() > b as u64 {
                self.keep_budget(b as u64);
            }
        }
    }

    /// Inserts a copy of `value` under `key` (replacing any entry) in class `priority`.
    ///
    /// # Errors
    /// [`Error::Os`] (ENOMEM) when a new slab cannot be mapped.
    pub fn insert(&self, key: K, value: &[u8], priority: Priority) -> Result<()> {
        self.insert_with(key, value.len(), priority, |buf| buf.copy_from_slice(value))
    }

    /// Inserts a value of `len` bytes written in place by `fill` (which sees zeroed or stale
    /// bytes: it must write all of them). If `fill` panics, nothing is inserted.
    ///
    /// # Errors
    /// As [`Cache::insert`].
    pub fn insert_with(
        &self,
        key: K,
        len: usize,
        priority: Priority,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<()> {
        let probation = self.on_probation(&key);
        let mut p = self.place(len, priority, probation)?;
        fill(p.buf());
        self.commit(key, &mut p, priority);
        p.committed = true; // the slot holds the count now
        p.slab.unpin();
        Ok(())
    }

    /// The value under `key`, pinned while the returned [`Entry`] lives; `None` if there is
    /// none (use [`Cache::lookup`] to learn whether it was purged).
    pub fn get<Q>(&self, key: &Q) -> Option<Entry>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.lookup(key).ok()
    }

    /// The value under `key`, pinned while the returned [`Entry`] lives, or why there is none.
    /// A purged entry is reported once ([`Miss::Purged`]) and dropped.
    ///
    /// # Errors
    /// [`Miss::Absent`] or [`Miss::Purged`].
    ///
    /// # Panics
    /// If 2^30 − 1 entries of the value's slab are already held (only leaked entries get
    /// there: `mem::forget`, raw values never released). A pin count that wrapped would let
    /// the slab be purged under its readers, so it is checked, as `Arc` checks its count.
    pub fn lookup<Q>(&self, key: &Q) -> std::result::Result<Entry, Miss>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        // Pinned under the map's guard: the slot's reference keeps the slab alive until the
        // pin does.
        let (slab, off, pinned) = match self.map.get(key) {
            Some(s) => {
                prefetch(s.slab.start() + s.off);
                let pinned = s.slab.pin();
                if pinned.is_ok() {
                    self.shared.counters.hit(s.slab.priority);
                    // SAFETY: the slot's place lies inside its slab, now pinned for the entry.
                    let ptr = unsafe { s.slab.at(s.off) };
                    let entry = Entry::pinned(&s.slab, ptr, s.len());
                    if !s.slab.probation {
                        s.hit();
                        return Ok(entry);
                    }
                    // The first hit on probation: the map's guard goes before the move.
                    let (slab, off) = (s.slab.clone(), s.off);
                    drop(s);
                    return Ok(self.promote(key, entry, &slab, off));
                }
                (s.slab.clone(), s.off, pinned)
            }
            None => {
                self.shared.counters.miss();
                return Err(Miss::Absent);
            }
        };
        debug_assert!(pinned.is_err());
        if self
            .map
            .remove_if(key, |_, s| Arc::ptr_eq(&s.slab, &slab) && s.off == off)
            .is_none()
        {
            // The entry changed since: its value carried out of the slab as it died
            // (`crate::merge`), replaced, or removed (by another lookup that saw the purge).
            return self.lookup(key);
        }
        if slab.probation {
            // Requested again after its probation value was purged unread: its next insert
            // skips probation.
            self.ghosts.remember(self.map.hasher().hash_one(key));
        }
        self.shared.counters.purged_lookup(slab.priority);
        Err(Miss::Purged)
    }

    /// The value under `key`, or the one `regenerate` writes in place (`len` bytes) if there
    /// is none or it was purged: the browser's "regenerate what was purged". Concurrent callers
    /// may regenerate the same key more than once; the last insert stays.
    ///
    /// # Errors
    /// As [`Cache::insert`].
    pub fn get_or_insert_with(
        &self,
        key: K,
        len: usize,
        priority: Priority,
        regenerate: impl FnOnce(&mut [u8]),
    ) -> Result<Entry> {
        if let Ok(e) = self.lookup(&key) {
            return Ok(e);
        }
        let probation = self.on_probation(&key);
        let mut p = self.place(len, priority, probation)?;
        regenerate(p.buf());
        self.commit(key, &mut p, priority);
        Ok(p.into_entry())
    }

    /// Whether an entry under `key` is held and its slab not purged. Pins nothing and counts
    /// no lookup (a purge it finds is still reported by the next [`Cache::lookup`]); the answer
    /// may be stale by the time the caller acts on it.
    pub fn contains_key<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.get(key).is_some_and(|s| {
            s.slab.check_purged();
            !s.slab.is_dead()
        })
    }

    /// The keys of the entries held now and not known to be purged (as [`Cache::contains_key`]
    /// says of each): a snapshot, taken one shard of the map at a time, so an insert or removal
    /// during the call may or may not be seen. Pins nothing and counts no lookup.
    pub fn keys(&self) -> Vec<K>
    where
        K: Clone,
    {
        self.sweep();
        self.map
            .iter()
            .filter(|e| {
                e.slab.check_purged();
                !e.slab.is_dead()
            })
            .map(|e| e.key().clone())
            .collect()
    }

    /// Removes the entry under `key`. Returns whether there was one (a purged one counts).
    /// Readers holding its value keep it until they drop their [`Entry`].
    pub fn remove<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.remove(key).is_some()
    }

    /// Removes every entry and closes the open slabs; memory returns as readers let go.
    pub fn clear(&self) {
        self.map.clear();
        for o in &self.open {
            o.lock().take();
        }
        *self.budget_lock.lock() = merge::Merge::default();
        self.sweep();
    }

    /// Entries held, not counting purged ones found by a sweep and not yet looked up.
    pub fn len(&self) -> usize {
        self.sweep();
        self.map
            .len()
            .saturating_sub(self.shared.counters.tombstones() as usize)
    }

    /// Whether [`Cache::len`] is zero.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Hits, misses and purges, and resident (an upper bound), mapped, pinned, value and purged
    /// bytes, by class.
    pub fn stats(&self) -> Stats {
        self.sweep();
        let mut value = [0u64; CLASSES];
        let mut pinned = [0u64; CLASSES];
        for s in self.slabs.iter() {
            if let Some(slab) = s.value().upgrade() {
                let c = class(slab.priority);
                if !slab.is_dead() {
                    value[c] = value[c].saturating_add(slab.live_bytes() as u64);
                }
                pinned[c] = pinned[c].saturating_add(slab.pinned_bytes() as u64);
            }
        }
        let classes = std::array::from_fn(|i| counters::ClassStats {
            value_bytes: value[i],
            pinned_bytes: pinned[i],
            ..self.shared.counters.class_stats(i)
        });
        Stats {
            entries: self
                .map
                .len()
                .saturating_sub(self.shared.counters.tombstones() as usize)
                as u64,
            misses: self.shared.counters.misses(),
            classes,
            dropped_purged: self.shared.counters.dropped_tombstones(),
        }
    }

    /// Finds slabs the reclaimer purged while no one looked, forgets freed ones, and drops
    /// tombstones once they outnumber live entries.
    fn sweep(&self) {
        self.shared.flush_idle();
        self.slabs.retain(|_, w| match w.upgrade() {
            Some(slab) => {
                slab.check_purged();
                // A dead slab's held pages still count as pinned.
                !slab.is_dead() || slab.has_holds()
            }
            None => false,
        });
        let tombstones = self.shared.counters.tombstones();
        // More tombstones than live entries: those of the older half of the deaths go.
        if tombstones > MIN_TOMBSTONES.max(self.map.len() as u64 / 2) {
            let last = self.shared.counters.deaths();
            let kept = (self.slabs.len() as u64 / 2).max(1);
            self.map
                .retain(|_, s| !s.slab.is_dead() || s.slab.died() + kept > last);
            let left = self.shared.counters.tombstones();
            self.shared
                .counters
                .tombstones_dropped(tombstones.saturating_sub(left));
        }
    }

    /// Evicts this cache's unpinned slabs in its eviction order, carrying their read values
    /// (see "Eviction" above), until its resident bytes are 15/16 of `budget`, or four slabs
    /// below it if that is closer (a small budget keeps nearly all of itself).
    fn keep_budget(&self, budget: u64) {
        let Some(mut merge) = self.budget_lock.try_lock() else {
            return; // another thread is at it
        };
        self.sweep();
        let target = budget - (budget / 16).min(4 * self.opts.slab_bytes as u64);
        if self.shared.counters.resident() <= target {
            return;
        }
        let victims = self.in_victim_order(|s| s.unpinned(), usize::MAX);
        for slab in victims {
            if self.shared.counters.resident() <= target {
                break;
            }
            self.evict(&slab, &mut merge);
        }
    }

    /// This cache's volatile slabs that `keep` accepts, in the order its own evictions take
    /// them (`crate::merge::victim_order`), at most `most` of them.
    pub(crate) fn in_victim_order(
        &self,
        keep: impl Fn(&Slab) -> bool,
        most: usize,
    ) -> Vec<Arc<Slab>> {
        let slabs: Vec<_> = self
            .slabs
            .iter()
            .filter_map(|s| s.value().upgrade())
            .filter(|s| !s.is_dead() && keep(s) && s.idle().is_some())
            .collect();
        merge::victim_order(slabs, most)
    }

    /// Releases a value handed out by [`Entry::into_raw`] (the C ABI's
    /// `vrange_cache_release`): drops one raw pin of the value at exactly `ptr`.
    ///
    /// Safe whatever `ptr` is: the cache keeps the address of every value it gave out raw and
    /// how many times, so a pointer it did not give out (another cache's value, an address
    /// inside a value), or one released as often as it was given out, is refused and no
    /// reader's pin is touched. Reading a released value is the caller's error, as with any
    /// raw pointer.
    ///
    /// # Errors
    /// [`Error::NotRegion`] if no value of this cache at `ptr` has a raw pin outstanding.
    pub fn release_raw(&self, ptr: *const u8) -> Result<()> {
        let (slab, len) = self
            .shared
            .raw_taken(ptr as usize)
            .ok_or(Error::NotRegion)?;
        // The record names a value of this slab held once more than released: its hold is listed.
        let released = slab.release_hold(ptr as usize - slab.start(), len);
        debug_assert!(released);
        Ok(())
    }
}
