//! One SQLite page cache: its pages (in hybrid regions), a record per page with SQLite's header
//! beside it (`records`), the hash from page number to record, and the list of unpinned pages
//! whose newest end is *held* (not volatile yet). It owns every mark and unmark of its pages
//! and never lets SQLite see a page whose content the system took without saying so; it never
//! decides when memory is short (`vrange::reclaimer::room` does) nor which memory goes first
//! across the process (the reclaimer does).
//!
//! Records are linked by pointer, as SQLite's own cache links its own: the hash's chains, the
//! list and the free list hold pointers into the chunks' records, which live as long as the
//! cache, and a page SQLite hands back is its record (the `sqlite3_pcache_page` comes first).
//! So a fetch reads one bucket and one record, and an unpin one record and the list's tail,
//! with no index arithmetic between.
//!
//! # Safety
//! Every record pointer this module holds or is given points to a record of one of the
//! cache's chunks: they are never freed before the cache, and the cache's lock makes its
//! holder their only user (SQLite touches a page's bytes and header, never the record).

use super::lock::{Guard, Lock};
use super::records::Records;
use super::PcachePage;
use libc::c_int;
use std::ptr::null_mut;
use std::sync::{Arc, Weak};
use std::time::Instant;
use vrange::reclaimer::{FlushHook, HOT};
use vrange::{Huge, Options, Policy, VolatileRegion};

/// Bytes of pages per region.
const CHUNK_BYTES: usize = 256 << 10;

/// Bytes of held pages (unpinned, not yet volatile) beyond which the oldest is made volatile
/// at once, whatever its age: the most memory of this cache that is neither SQLite's (pinned)
/// nor the system's to take (volatile). SQLite's pages used again within `HOT` fit: with
/// speedtest1 (`--size 50`, 20,000 pages of cache), 4 MiB held leaves one fetch of an unpinned
/// page in 31 changing a range's state, 1 MiB one in 6.
pub(crate) const HELD_BYTES: usize = 4 << 20;

/// Unpins between two readings of the clock (a page's `since` may be this many unpins early:
/// microseconds, against `HOT`'s 50 ms).
const CLOCK_EVERY: u32 = 64;

/// Allocations between two looks at the room left while it is not short.
const CHECK_EVERY: u32 = 16;

/// The hash's buckets when the cache is made (a power of two).
const MIN_BUCKETS: usize = 256;

/// No record (the ends of the list and of hash chains, an empty bucket).
const NIL: *mut Page = null_mut();

/// Where a page is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Free and never used: pinned in its region, never touched, so it holds no memory.
    Fresh,
    /// Free after use: volatile (its content is garbage).
    Free,
    /// A page SQLite holds.
    Pinned,
    /// A page SQLite let go less than `HOT` ago (and within the newest `HELD_BYTES`): in the
    /// list, not volatile yet, so that fetching it again changes no range's state.
    Held,
    /// A page SQLite let go, volatile: the system may take its memory.
    Volatile,
}

/// A page's record: the `sqlite3_pcache_page` handed to SQLite (first, so that a page pointer
/// is a record pointer), then what the cache keeps about it; SQLite's header follows on the
/// next cache line.
#[repr(C)]
pub(crate) struct Page {
    pub page: PcachePage,
    /// The next record in its hash bucket (pages in the hash only).
    chain: *mut Page,
    /// Neighbours in the list of unpinned pages (null at its ends and outside it).
    prev: *mut Page,
    next: *mut Page,
    /// When SQLite last let it go (ns since the cache was made).
    since: u64,
    key: u32,
    /// Its chunk (whose region holds `page.buf`).
    chunk: u32,
    state: State,
}

/// A region of pages with their records and headers (stable addresses).
struct Chunk {
    region: VolatileRegion,
    /// Owned here, reached through the pointers the cache keeps.
    _records: Records<Page>,
}

/// The cache's state, under its lock.
pub(crate) struct Inner {
    stride: usize,
    per_chunk: usize,
    /// Bytes of SQLite's header per page.
    extra: usize,
    purgeable: bool,
    /// `cache_size`, in pages.
    max: usize,
    /// Held pages at most (see [`HELD_BYTES`]).
    held_max: usize,
    chunks: Vec<Chunk>,
    free: Vec<*mut Page>,
    /// The hash: buckets (a power of two), each the first record of a chain, and the pages in
    /// it (at most one per bucket on average).
    buckets: Vec<*mut Page>,
    count: usize,
    /// At least every key in the hash (SQLite truncates at every commit: nothing to do is O(1)).
    max_key: u32,
    /// The list of unpinned pages, least recently unpinned first: volatile pages, then, from
    /// `held_head` to the tail, held ones.
    head: *mut Page,
    tail: *mut Page,
    held_head: *mut Page,
    held: usize,
    /// The `since` of `held_head` (read at every unpin: kept here rather than in a cold record).
    held_since: u64,
    /// The clock as last read (ns since `born`), and unpins until the next reading.
    clock: u64,
    clock_in: u32,
    /// Pages allocated, and whether memory was short at the last look (see `short`).
    allocs: u32,
    was_short: bool,
    born: Instant,
    /// Time this cache was told has passed beyond its clock (tests age pages without waiting).
    #[cfg(test)]
    skew: u64,
}

// SAFETY: the raw pointers point into the chunks this state owns (regions and records), which
// move with it; they are used only under the cache's lock, or, for a page's bytes and header,
// by SQLite while it holds the page, as the pcache contract allows from any thread.
unsafe impl Send for Inner {}

/// `sqlite3_pcache` (opaque to SQLite): the state, and the flush hook that makes held pages
/// volatile when SQLite does not call (idle) and before every purge.
pub(crate) struct Cache {
    // Dropped first: no flush runs on this cache's behalf after it.
    _flush: Option<FlushHook>,
    inner: Arc<Lock<Inner>>,
}

impl Cache {
    /// A cache of pages of `size` bytes with `extra` bytes of header each; `None` for sizes
    /// SQLite never asks for.
    pub fn new(size: c_int, extra: c_int, purgeable: bool) -> Option<Cache> {
        let sys = vrange::page_size();
        let size = usize::try_from(size).ok().filter(|&s| s > 0)?;
        let extra = usize::try_from(extra).ok()?;
        let stride = size.checked_next_multiple_of(sys)?;
        let inner = Arc::new(Lock::new(Inner {
            stride,
            per_chunk: (CHUNK_BYTES / stride).max(1),
            extra,
            purgeable,
            max: usize::MAX,
            held_max: (HELD_BYTES / stride).max(1),
            chunks: Vec::new(),
            free: Vec::new(),
            buckets: vec![NIL; MIN_BUCKETS],
            count: 0,
            max_key: 0,
            head: NIL,
            tail: NIL,
            held_head: NIL,
            held: 0,
            held_since: 0,
            clock: 0,
            clock_in: 0,
            allocs: 0,
            was_short: false,
            born: Instant::now(),
            #[cfg(test)]
            skew: 0,
        }));
        // A cache that is not purgeable never marks a page it holds (they are the only copy).
        let flush = purgeable.then(|| {
            let weak: Weak<Lock<Inner>> = Arc::downgrade(&inner);
            vrange::reclaimer::on_flush(move || {
                // Never waits: the cache's own thread may be purging under this lock.
                if let Some(inner) = weak.upgrade() {
                    if let Some(mut c) = inner.try_lock() {
                        c.read_clock();
                        c.settle();
                    }
                }
            })
        });
        Some(Cache {
            _flush: flush,
            inner,
        })
    }

    /// The state, locked.
    pub fn lock(&self) -> Guard<'_, Inner> {
        self.inner.lock()
    }
}

/// The record `p` points to.
///
/// # Safety
/// `p` is a record of this cache (see the module's safety section), and no other reference to
/// it is in use.
#[inline]
unsafe fn rec<'a>(p: *mut Page) -> &'a mut Page {
    // SAFETY: the caller's contract.
    unsafe { &mut *p }
}

impl Inner {
    /// Reads the clock into `clock`. Every mark of a page reads it first (see `settle`), so a
    /// page unpinned after its mark is never stamped earlier than that mark.
    fn read_clock(&mut self) {
        self.clock = self.born.elapsed().as_nanos() as u64;
        #[cfg(test)]
        {
            self.clock += self.skew;
        }
        self.clock_in = CLOCK_EVERY;
    }

    /// Makes this cache's clock run `by` ahead (tests: pages age without waiting).
    #[cfg(test)]
    pub fn age(&mut self, by: std::time::Duration) {
        self.skew += by.as_nanos() as u64;
        self.read_clock();
    }

    /// The bucket of `key`: its low bits, as SQLite's own cache hashes. Page numbers are
    /// dense from 1, and pages used together are often numbered together, so neighbouring
    /// keys share the bucket array's cache lines (a multiplicative hash scattered them: a
    /// cache miss more per fetch).
    #[inline]
    fn bucket(&self, key: u32) -> usize {
        key as usize & (self.buckets.len() - 1)
    }

    /// The record of page `key`, or null.
    #[inline]
    fn find(&self, key: u32) -> *mut Page {
        let mut p = self.buckets[self.bucket(key)];
        while p != NIL {
            // SAFETY: the hash holds records of this cache.
            let r = unsafe { rec(p) };
            if r.key == key {
                break;
            }
            p = r.chain;
        }
        p
    }

    /// Enters `p` as page `key` (not in the hash yet).
    fn insert(&mut self, key: u32, p: *mut Page) {
        if self.count >= self.buckets.len() {
            self.rehash(self.buckets.len() * 2);
        }
        let b = self.bucket(key);
        // SAFETY: a record of this cache.
        let r = unsafe { rec(p) };
        r.key = key;
        r.chain = self.buckets[b];
        self.buckets[b] = p;
        self.count += 1;
        self.max_key = self.max_key.max(key);
    }

    /// Takes `p` (in the hash) out of it.
    fn remove(&mut self, p: *mut Page) {
        // SAFETY: a record of this cache, and the records of its chain.
        unsafe {
            let (key, next) = (rec(p).key, rec(p).chain);
            let b = self.bucket(key);
            if self.buckets[b] == p {
                self.buckets[b] = next;
            } else {
                let mut at = self.buckets[b];
                while at != NIL {
                    let r = rec(at);
                    if r.chain == p {
                        r.chain = next;
                        break;
                    }
                    at = r.chain;
                }
            }
            rec(p).chain = NIL;
        }
        self.count -= 1;
    }

    /// Every record in the hash.
    fn hashed(&self) -> Vec<*mut Page> {
        let mut all = Vec::with_capacity(self.count);
        for &head in &self.buckets {
            let mut p = head;
            while p != NIL {
                all.push(p);
                // SAFETY: the hash holds records of this cache.
                p = unsafe { rec(p) }.chain;
            }
        }
        all
    }

    fn rehash(&mut self, buckets: usize) {
        let all = self.hashed();
        self.buckets = vec![NIL; buckets];
        for p in all {
            // SAFETY: records of this cache.
            let r = unsafe { rec(p) };
            let b = self.bucket(r.key);
            r.chain = self.buckets[b];
            self.buckets[b] = p;
        }
    }

    /// The region holding `p`'s page and the page's offset in it.
    fn at(&self, p: *mut Page) -> (&VolatileRegion, usize) {
        // SAFETY: a record of this cache.
        let r = unsafe { rec(p) };
        let region = &self.chunks[r.chunk as usize].region;
        (region, r.page.buf as usize - region.as_ptr() as usize)
    }

    /// Marks `p`'s page volatile (its content may go).
    fn release(&self, p: *mut Page) {
        let (region, offset) = self.at(p);
        // SAFETY: SQLite does not touch an unpinned or freed page (the pcache contract), and
        // nothing here keeps a reference into it.
        let _ = unsafe { region.mark_range(offset, self.stride) };
    }

    /// Pins `p`'s page, which was volatile; whether its content survived. `None`: it could
    /// not be pinned (no registry slot for the split: ENOMEM) and is still volatile, so it must
    /// not be handed to SQLite.
    fn take(&self, p: *mut Page) -> Option<bool> {
        let (region, offset) = self.at(p);
        region
            .unmark_range(offset, self.stride)
            .ok()
            .map(|u| !u.was_purged())
    }

    /// Marks `p`'s page new for SQLite (the first word of its header zeroed).
    fn zero_extra(p: *mut Page) {
        // SAFETY: a record of this cache.
        let extra = unsafe { rec(p) }.page.extra;
        if !extra.is_null() {
            // SAFETY: the header lies beside the record, at least a word (see `records`).
            unsafe { extra.cast::<u64>().write(0) };
        }
    }

    /// Appends `p` (just unpinned: held) to the list.
    #[inline]
    fn push_back(&mut self, p: *mut Page) {
        // SAFETY: `p` and the tail are records of this cache, and distinct (`p` was pinned).
        unsafe {
            let r = rec(p);
            r.prev = self.tail;
            r.next = NIL;
            match self.tail {
                NIL => self.head = p,
                t => rec(t).next = p,
            }
        }
        self.tail = p;
        self.held += 1;
        if self.held_head == NIL {
            self.set_held_head(p);
        }
    }

    /// Takes `p` (held or volatile) out of the list.
    #[inline]
    fn unlink(&mut self, p: *mut Page) {
        // SAFETY: `p` and its neighbours are records of this cache, each reached in turn.
        unsafe {
            let r = rec(p);
            let (prev, next) = (r.prev, r.next);
            if r.state == State::Held {
                self.held -= 1;
                if self.held_head == p {
                    self.set_held_head(next);
                }
            }
            match prev {
                NIL => self.head = next,
                q => rec(q).next = next,
            }
            match next {
                NIL => self.tail = prev,
                q => rec(q).prev = prev,
            }
            let r = rec(p);
            r.prev = NIL;
            r.next = NIL;
        }
    }

    fn set_held_head(&mut self, p: *mut Page) {
        self.held_head = p;
        if p != NIL {
            // SAFETY: a record of this cache.
            self.held_since = unsafe { rec(p) }.since;
        }
    }

    /// Whether a held page is due to become volatile (see `settle`), by `clock`.
    #[inline]
    fn due(&self) -> bool {
        self.held_head != NIL
            && (self.held > self.held_max
                || self.clock.saturating_sub(self.held_since) >= HOT.as_nanos() as u64)
    }

    /// Makes held pages volatile, oldest first: those idle for `HOT` (so that no mark of a
    /// page follows its previous one within `HOT`: the reclaimer arms it for the reserve, and
    /// while the reserve is short its mark arms it), and beyond `held_max` whatever their age.
    /// Only in a purgeable cache (the caller's check). Reads the clock before it marks.
    #[inline(never)]
    fn settle(&mut self) {
        if !self.due() {
            return;
        }
        self.read_clock();
        while self.due() {
            let p = self.held_head;
            self.release(p);
            // SAFETY: a record of this cache (the list's).
            let r = unsafe { rec(p) };
            r.state = State::Volatile;
            let next = r.next;
            self.held -= 1;
            self.set_held_head(next);
        }
    }

    /// Whether memory is short for the pages this cache may take before it looks again
    /// ([`CHECK_EVERY`] of them; `vrange::short::Room::short_for`), read every
    /// [`CHECK_EVERY`] allocations. Not at each while short: a cache that fills its memory
    /// stays at the edge of short, and a look costs two `fstat`s and two `pread`s, one of
    /// `memory.stat`, which the kernel formats anew (tens of microseconds: a fifth of the
    /// time of a workload missing in a full cache); while short, the next pages recycle old
    /// ones and take nothing more, so the look can wait.
    fn short(&mut self) -> bool {
        self.allocs = self.allocs.wrapping_add(1);
        if self.allocs % CHECK_EVERY == 1 {
            let next = (self.stride as u64).saturating_mul(u64::from(CHECK_EVERY));
            self.was_short = vrange::reclaimer::room().is_some_and(|room| room.short_for(next));
        }
        self.was_short
    }

    /// A record for a new page, its page pinned and its header marked new; `None` if memory
    /// could not be mapped.
    ///
    /// SQLite reads pages at the speed of the page cache (a scan, several connections at
    /// once), faster than the reclaimer's tick, and a page SQLite has filled is memory nobody
    /// can take back until it is unpinned. So while memory is short, a new page takes the
    /// record of this cache's oldest unpinned page, whose memory is charged already (kept
    /// unless the system took it), instead of charging more; and with none to take, makes
    /// room as any client does before it maps memory.
    fn alloc(&mut self) -> Option<*mut Page> {
        let p = if self.purgeable && self.short() && self.head != NIL {
            let old = self.head;
            if self.forget(old) == State::Volatile && self.take(old).is_none() {
                // SAFETY: a record of this cache; still volatile, as a free record is.
                unsafe { rec(old) }.state = State::Free;
                self.free.push(old);
                return None;
            }
            old
        } else {
            if self.purgeable && self.was_short {
                vrange::reclaimer::make_room(self.stride);
            }
            if self.free.is_empty() {
                self.grow()?;
            }
            let p = self.free.pop()?;
            // SAFETY: the free list holds records of this cache.
            if unsafe { rec(p) }.state == State::Free && self.take(p).is_none() {
                self.free.push(p);
                return None;
            }
            p
        };
        Self::zero_extra(p);
        Some(p)
    }

    fn grow(&mut self) -> Option<()> {
        let chunk = u32::try_from(self.chunks.len()).ok()?;
        let len = self.per_chunk.checked_mul(self.stride)?;
        let opts = Options {
            policy: Policy::Hybrid,
            huge: Huge::Never,
            ..Options::default()
        };
        // Pinned, untouched: no memory until SQLite writes a page.
        let region = VolatileRegion::new(len, opts).ok()?;
        let base = region.as_ptr();
        let stride = self.stride;
        let records = Records::new(self.per_chunk, self.extra, |i, extra| Page {
            page: PcachePage {
                // SAFETY: `i * stride` lies inside the region (per_chunk pages of stride).
                buf: unsafe { base.add(i * stride) }.cast(),
                extra,
            },
            chain: NIL,
            prev: NIL,
            next: NIL,
            since: 0,
            key: 0,
            chunk,
            state: State::Fresh,
        })?;
        self.free
            .extend((0..self.per_chunk).rev().map(|i| records.at(i)));
        self.chunks.push(Chunk {
            region,
            _records: records,
        });
        Some(())
    }

    /// Takes a page out of the hash and the list; returns its state then. The record is the
    /// caller's to free or reuse.
    fn forget(&mut self, p: *mut Page) -> State {
        // SAFETY: a record of this cache.
        let state = unsafe { rec(p) }.state;
        self.remove(p);
        if matches!(state, State::Held | State::Volatile) {
            self.unlink(p);
        }
        state
    }

    /// Forgets a page and frees its record (volatile: its content is garbage now).
    fn discard(&mut self, p: *mut Page) {
        // SAFETY: a record of this cache.
        if matches!(unsafe { rec(p) }.state, State::Free | State::Fresh) {
            return;
        }
        if self.forget(p) != State::Volatile {
            self.release(p);
        }
        // SAFETY: as above.
        unsafe { rec(p) }.state = State::Free;
        self.free.push(p);
    }

    /// Discards unpinned pages, oldest first, until at most `keep` pages are held. Not in a
    /// cache that is not purgeable: its pages are the only copy of their data (as SQLite's own
    /// cache, it ignores `cache_size` then).
    #[inline(never)]
    fn trim(&mut self, keep: usize) {
        while self.purgeable && self.count > keep && self.head != NIL {
            self.discard(self.head);
        }
    }

    /// SQLite's `xFetch`. The paths taken most (a page SQLite holds, or let go a moment ago)
    /// inline; the rest in [`Inner::fetch_slow`].
    #[inline]
    pub fn fetch(&mut self, key: u32, create: c_int) -> *mut PcachePage {
        let p = self.find(key);
        if p != NIL {
            // SAFETY: a record of this cache (the hash's).
            match unsafe { rec(p) }.state {
                State::Pinned => return p.cast(),
                State::Held => {
                    self.unlink(p);
                    // SAFETY: as above.
                    unsafe { rec(p) }.state = State::Pinned;
                    return p.cast();
                }
                _ => {}
            }
        }
        self.fetch_slow(p, key, create)
    }

    /// [`Inner::fetch`] of a volatile page (`p`) or of one not in the cache (`p` null).
    #[inline(never)]
    fn fetch_slow(&mut self, p: *mut Page, key: u32, create: c_int) -> *mut PcachePage {
        if p != NIL {
            self.unlink(p);
            // SAFETY: a record of this cache (the hash's), volatile.
            unsafe { rec(p) }.state = State::Pinned;
            match self.take(p) {
                Some(true) => {}
                // The system took it: SQLite reads it from the file again.
                Some(false) if create != 0 => Self::zero_extra(p),
                // Taken by the system, or not pinnable now (still volatile): never handed out.
                Some(false) | None => {
                    self.discard(p);
                    return null_mut();
                }
            }
            return p.cast();
        }
        if create == 0 {
            return null_mut();
        }
        if self.purgeable && self.count >= self.max {
            self.trim(self.max.saturating_sub(1));
            if self.count >= self.max && create == 1 {
                return null_mut();
            }
        }
        let Some(p) = self.alloc() else {
            return null_mut();
        };
        self.insert(key, p);
        // SAFETY: a record of this cache.
        unsafe { rec(p) }.state = State::Pinned;
        p.cast()
    }

    /// SQLite's `xUnpin`.
    ///
    /// # Safety
    /// `page` was handed out by this cache's [`Inner::fetch`].
    #[inline]
    pub unsafe fn unpin(&mut self, page: *mut PcachePage, discard: bool) {
        let p = page.cast::<Page>();
        if discard {
            self.discard(p);
            return;
        }
        // SAFETY: the caller's contract: a record of this cache.
        let r = unsafe { rec(p) };
        if r.state != State::Pinned {
            return;
        }
        if self.clock_in == 0 {
            self.read_clock();
        }
        self.clock_in -= 1;
        r.state = State::Held;
        r.since = self.clock;
        self.push_back(p);
        if self.purgeable && self.due() {
            self.settle();
        }
        if self.count > self.max {
            self.trim(self.max);
        }
    }

    /// SQLite's `xRekey`: moves a page to key `new` (`old` is its key), discarding a page
    /// there before.
    ///
    /// # Safety
    /// As [`Inner::unpin`].
    pub unsafe fn rekey(&mut self, page: *mut PcachePage, _old: u32, new: u32) {
        let p = page.cast::<Page>();
        // SAFETY: the caller's contract: a record of this cache.
        if matches!(unsafe { rec(p) }.state, State::Free | State::Fresh) {
            return;
        }
        let other = self.find(new);
        if other == p {
            return;
        }
        if other != NIL {
            self.discard(other);
        }
        self.remove(p);
        self.insert(new, p);
    }

    pub fn truncate(&mut self, limit: u32) {
        if self.count == 0 || limit > self.max_key {
            return;
        }
        self.max_key = limit.saturating_sub(1);
        for p in self.hashed() {
            // SAFETY: the hash holds records of this cache.
            if unsafe { rec(p) }.key >= limit {
                self.discard(p);
            }
        }
    }

    pub fn set_max(&mut self, pages: usize) {
        self.max = pages.max(1);
        self.trim(self.max);
    }

    pub fn count(&self) -> usize {
        self.count
    }

    /// Gives back the memory of every unpinned page (`sqlite3_db_release_memory`,
    /// `sqlite3_release_memory`): discarded, then purged now with the rest of the free pages.
    pub fn shrink(&mut self) {
        if !self.purgeable {
            return;
        }
        while self.head != NIL {
            self.discard(self.head);
        }
        for c in &self.chunks {
            // Pinned pages stay: a purge takes volatile ranges only.
            let _ = c.region.purge();
        }
    }
}
