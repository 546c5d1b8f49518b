//! A page cache for SQLite ([`methods`]: a `sqlite3_pcache_methods2`, installed with
//! `sqlite3_config(SQLITE_CONFIG_PCACHE2, ...)` before SQLite starts; the C ABI exports it as
//! `vrange_sqlite_pcache()`) whose unpinned pages are volatile: the system may take them back under memory pressure, in the
//! same global order as all other vrange memory, and SQLite reads a taken page from its file
//! again, as it would after its own cache evicted it.
//!
//! - Pages live in managed regions of about 256 KiB, one volatile range per page (a page's
//!   stride is its size rounded up to a system page: pages under 4 KiB waste the rest).
//!   SQLite's per-page header (`pExtra`) lives in ordinary memory beside them and is never
//!   purged.
//! - `xUnpin` marks the page volatile (one atomic step); `xFetch` of an unpinned page unmarks
//!   it, and if the system took it (exact detection), hands it back as a new page (the first
//!   word of `pExtra` zeroed, as SQLite's own cache does, so SQLite reads it from the file), or,
//!   when asked not to create pages, reports it absent.
//! - Only clean pages are unpinned by SQLite; pages of a cache that is not purgeable
//!   (`:memory:` and temporary databases, `bPurgeable == 0`) are never marked volatile: they
//!   hold the only copy of their data.
//! - Keeping the pages: while memory is short for the next 16 pages (`vrange::short`: they
//!   would leave the memory cgroup's free memory under the headroom threshold; two `pread`s,
//!   every 16 new pages or at each while short), a new page takes the slot of the cache's
//!   oldest unpinned page, memory already charged, instead of charging more (see
//!   `Inner::alloc`).
//! - `cache_size` is honoured as SQLite's own cache honours it (unpinned pages beyond it are
//!   discarded oldest first); set it large and let memory pressure bound the cache.
//! - Each cache has its own lock; SQLite calls one cache from one thread at a time, several
//!   caches from several threads.
//!
//! It never links SQLite: the methods table and the page it hands out are built by their C
//! layout in sqlite3.h, and SQLite is whichever the program uses. No panic reaches SQLite.

#![deny(unsafe_op_in_unsafe_fn)]

use libc::{c_int, c_uint, c_void};
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::null_mut;
use std::sync::Mutex;
use vrange::{Huge, Options, Policy, VolatileRegion};

/// Page number → slot.
type PageMap = HashMap<u32, u32, foldhash::fast::RandomState>;

/// `sqlite3_pcache_page` of sqlite3.h.
#[repr(C)]
struct PcachePage {
    buf: *mut c_void,
    extra: *mut c_void,
}

/// A page as handed to SQLite: its `sqlite3_pcache_page` first, then its slot.
#[repr(C)]
struct Page {
    page: PcachePage,
    slot: u32,
}

/// `sqlite3_pcache_methods2` of sqlite3.h (version 1).
#[repr(C)]
struct PcacheMethods2 {
    version: c_int,
    arg: *mut c_void,
    init: unsafe extern "C" fn(*mut c_void) -> c_int,
    shutdown: unsafe extern "C" fn(*mut c_void),
    create: unsafe extern "C" fn(c_int, c_int, c_int) -> *mut c_void,
    cachesize: unsafe extern "C" fn(*mut c_void, c_int),
    pagecount: unsafe extern "C" fn(*mut c_void) -> c_int,
    fetch: unsafe extern "C" fn(*mut c_void, c_uint, c_int) -> *mut PcachePage,
    unpin: unsafe extern "C" fn(*mut c_void, *mut PcachePage, c_int),
    rekey: unsafe extern "C" fn(*mut c_void, *mut PcachePage, c_uint, c_uint),
    truncate: unsafe extern "C" fn(*mut c_void, c_uint),
    destroy: unsafe extern "C" fn(*mut c_void),
    shrink: unsafe extern "C" fn(*mut c_void),
}

// SAFETY: the table holds function pointers and a null argument; SQLite copies it.
unsafe impl Sync for PcacheMethods2 {}

static METHODS: PcacheMethods2 = PcacheMethods2 {
    version: 1,
    arg: null_mut(),
    init: x_init,
    shutdown: x_shutdown,
    create: x_create,
    cachesize: x_cachesize,
    pagecount: x_pagecount,
    fetch: x_fetch,
    unpin: x_unpin,
    rekey: x_rekey,
    truncate: x_truncate,
    destroy: x_destroy,
    shrink: x_shrink,
};

/// The page cache methods, a `const sqlite3_pcache_methods2 *` for
/// `sqlite3_config(SQLITE_CONFIG_PCACHE2, methods())`.
pub fn methods() -> *const c_void {
    std::ptr::addr_of!(METHODS).cast()
}

/// Bytes of pages per region.
const CHUNK_BYTES: usize = 256 << 10;

/// Where a slot is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Free,
    Pinned,
    Unpinned,
}

/// A region of pages with their headers and `Page` records (stable addresses).
struct Chunk {
    region: VolatileRegion,
    extras: Box<[u64]>,
    pages: Box<[Page]>,
}

struct Inner {
    stride: usize,
    extra_words: usize,
    purgeable: bool,
    max: usize,
    per_chunk: usize,
    chunks: Vec<Chunk>,
    free: Vec<u32>,
    map: PageMap,
    /// At least every key in `map` (SQLite truncates at every commit: nothing to do is O(1)).
    max_key: u32,
    key: Vec<u32>,
    state: Vec<State>,
    /// Unpinned slots, least recently unpinned first: exactly the slots in `State::Unpinned`.
    unpinned: Lru,
    /// Pages allocated, and whether memory was short at the last look (see `short`).
    allocs: u32,
    was_short: bool,
}

/// Allocations between two looks at the room left while it is not short.
const CHECK_EVERY: u32 = 16;

/// No slot (the ends of [`Lru`]).
const NIL: u32 = u32::MAX;

/// A list of slots threaded through two arrays indexed by slot (as SQLite's own cache keeps
/// its LRU list), so that unpinning, pinning again and taking the oldest are each O(1).
struct Lru {
    prev: Vec<u32>,
    next: Vec<u32>,
    head: u32,
    tail: u32,
}

impl Lru {
    fn new() -> Lru {
        Lru {
            prev: Vec::new(),
            next: Vec::new(),
            head: NIL,
            tail: NIL,
        }
    }

    /// Makes room for slots `0..n`.
    fn grow(&mut self, n: usize) {
        self.prev.resize(n, NIL);
        self.next.resize(n, NIL);
    }

    /// The least recently pushed slot.
    fn front(&self) -> Option<u32> {
        (self.head != NIL).then_some(self.head)
    }

    /// Appends `slot`, which must not be in the list.
    fn push_back(&mut self, slot: u32) {
        let i = slot as usize;
        self.prev[i] = self.tail;
        self.next[i] = NIL;
        match self.tail {
            NIL => self.head = slot,
            t => self.next[t as usize] = slot,
        }
        self.tail = slot;
    }

    /// Takes out `slot`, which must be in the list.
    fn remove(&mut self, slot: u32) {
        let i = slot as usize;
        let (p, n) = (self.prev[i], self.next[i]);
        match p {
            NIL => self.head = n,
            p => self.next[p as usize] = n,
        }
        match n {
            NIL => self.tail = p,
            n => self.prev[n as usize] = p,
        }
        self.prev[i] = NIL;
        self.next[i] = NIL;
    }
}

/// `sqlite3_pcache` (opaque to SQLite).
struct Cache(Mutex<Inner>);

impl Inner {
    fn page(&mut self, slot: u32) -> *mut PcachePage {
        let (c, i) = self.at(slot);
        std::ptr::addr_of_mut!(self.chunks[c].pages[i].page)
    }

    fn at(&self, slot: u32) -> (usize, usize) {
        let s = slot as usize;
        (s / self.per_chunk, s % self.per_chunk)
    }

    /// Marks a slot's page volatile (its content may go).
    fn release(&self, slot: u32) {
        let (c, i) = self.at(slot);
        // SAFETY: SQLite does not touch an unpinned or freed page (the pcache contract), and
        // nothing here keeps a reference into it.
        let _ = unsafe {
            self.chunks[c]
                .region
                .mark_range(i * self.stride, self.stride)
        };
    }

    /// Pins a slot's page; whether its content survived.
    fn take(&self, slot: u32) -> bool {
        let (c, i) = self.at(slot);
        match self.chunks[c]
            .region
            .unmark_range(i * self.stride, self.stride)
        {
            Ok(u) => !u.was_purged(),
            Err(_) => false,
        }
    }

    fn zero_extra(&mut self, slot: u32) {
        let (c, i) = self.at(slot);
        if self.extra_words > 0 {
            self.chunks[c].extras[i * self.extra_words] = 0;
        }
    }

    /// Whether memory is short for the pages this cache may take before it looks again
    /// ([`CHECK_EVERY`] of them; `vrange::short::Room::short_for`). Read at every allocation
    /// while short, else every [`CHECK_EVERY`].
    fn short(&mut self) -> bool {
        self.allocs = self.allocs.wrapping_add(1);
        if self.was_short || self.allocs % CHECK_EVERY == 0 {
            let next = (self.stride as u64).saturating_mul(u64::from(CHECK_EVERY));
            self.was_short = vrange::reclaimer::room().is_some_and(|room| room.short_for(next));
        }
        self.was_short
    }

    /// A free slot, pinned, its `pExtra` marked new; `None` if memory could not be mapped.
    ///
    /// SQLite reads pages at the speed of the page cache (a scan, several connections at
    /// once), faster than the reclaimer's tick, and a page SQLite has filled is memory nobody
    /// can take back until it is unpinned. So while memory is short, a new page takes the
    /// slot of this cache's oldest unpinned page, whose memory is charged already (kept unless
    /// the system took it), instead of charging more; and with none to take, makes room as
    /// any client does before it maps memory.
    fn alloc(&mut self) -> Option<u32> {
        if self.purgeable && self.short() {
            if let Some(old) = self.oldest_unpinned() {
                self.discard(old);
            } else {
                vrange::reclaimer::make_room(self.stride);
            }
        }
        if self.free.is_empty() {
            self.grow()?;
        }
        let slot = self.free.pop()?;
        self.take(slot);
        self.zero_extra(slot);
        Some(slot)
    }

    fn grow(&mut self) -> Option<()> {
        let first = u32::try_from(self.chunks.len().checked_mul(self.per_chunk)?).ok()?;
        // Slots are u32 below NIL (the list's sentinel).
        let end = first
            .checked_add(u32::try_from(self.per_chunk).ok()?)
            .filter(|&e| e < NIL)?;
        let len = self.per_chunk.checked_mul(self.stride)?;
        let extra_len = self.per_chunk.checked_mul(self.extra_words.max(1))?;
        let opts = Options {
            policy: Policy::Managed,
            huge: Huge::Never,
            ..Options::default()
        };
        let region = VolatileRegion::new(len, opts).ok()?;
        let mut extras = vec![0u64; extra_len].into_boxed_slice();
        let base = region.as_ptr();
        let pages = (0..self.per_chunk)
            .map(|i| Page {
                page: PcachePage {
                    // SAFETY: `i * stride` lies inside the region (per_chunk pages of stride).
                    buf: unsafe { base.add(i * self.stride) }.cast(),
                    extra: if self.extra_words > 0 {
                        std::ptr::addr_of_mut!(extras[i * self.extra_words]).cast()
                    } else {
                        null_mut()
                    },
                },
                slot: first + i as u32,
            })
            .collect();
        self.chunks.push(Chunk {
            region,
            extras,
            pages,
        });
        let new = first..end;
        self.key.extend(new.clone().map(|_| 0));
        self.state.extend(new.clone().map(|_| State::Free));
        self.unpinned.grow(self.state.len());
        // Free pages are volatile: they hold nothing.
        for s in new.clone() {
            self.release(s);
        }
        self.free.extend(new.rev());
        Some(())
    }

    /// Forgets a slot's page and frees the slot.
    fn discard(&mut self, slot: u32) {
        if self.state[slot as usize] == State::Free {
            return;
        }
        let key = self.key[slot as usize];
        if self.map.get(&key) == Some(&slot) {
            self.map.remove(&key);
        }
        let state = self.state[slot as usize];
        if state == State::Unpinned {
            self.unpinned.remove(slot);
        }
        // An unpinned page of a purgeable cache is volatile already.
        if state == State::Pinned || !self.purgeable {
            self.release(slot);
        }
        self.state[slot as usize] = State::Free;
        self.free.push(slot);
    }

    /// This cache's oldest unpinned page, if any.
    fn oldest_unpinned(&self) -> Option<u32> {
        self.unpinned.front()
    }

    /// Discards unpinned pages, oldest first, until at most `keep` pages are held. Not in a
    /// cache that is not purgeable: its pages are the only copy of their data (as SQLite's own
    /// cache, it ignores `cache_size` then).
    fn trim(&mut self, keep: usize) {
        while self.purgeable && self.map.len() > keep {
            let Some(slot) = self.oldest_unpinned() else {
                return;
            };
            self.discard(slot);
        }
    }

    fn fetch(&mut self, key: u32, create: c_int) -> *mut PcachePage {
        if let Some(&slot) = self.map.get(&key) {
            if self.state[slot as usize] == State::Unpinned {
                self.unpinned.remove(slot);
                let intact = !self.purgeable || self.take(slot);
                self.state[slot as usize] = State::Pinned;
                if !intact {
                    // The system took it: SQLite reads it from the file again.
                    if create == 0 {
                        self.discard(slot);
                        return null_mut();
                    }
                    self.zero_extra(slot);
                }
            }
            return self.page(slot);
        }
        if create == 0 {
            return null_mut();
        }
        if self.purgeable && self.map.len() >= self.max {
            self.trim(self.max.saturating_sub(1));
            if self.map.len() >= self.max && create == 1 {
                return null_mut();
            }
        }
        let Some(slot) = self.alloc() else {
            return null_mut();
        };
        self.map.insert(key, slot);
        self.max_key = self.max_key.max(key);
        self.key[slot as usize] = key;
        self.state[slot as usize] = State::Pinned;
        self.page(slot)
    }

    fn unpin(&mut self, slot: u32, discard: bool) {
        if discard {
            self.discard(slot);
            return;
        }
        if self.state[slot as usize] != State::Pinned {
            return;
        }
        self.state[slot as usize] = State::Unpinned;
        if self.purgeable {
            self.release(slot);
        }
        self.unpinned.push_back(slot);
        self.trim(self.max);
    }

    fn rekey(&mut self, slot: u32, old: u32, new: u32) {
        if let Some(other) = self.map.get(&new).copied() {
            if other != slot {
                self.discard(other);
            }
        }
        if self.map.get(&old) == Some(&slot) {
            self.map.remove(&old);
        }
        self.map.insert(new, slot);
        self.max_key = self.max_key.max(new);
        self.key[slot as usize] = new;
    }

    fn truncate(&mut self, limit: u32) {
        if self.map.is_empty() || limit > self.max_key {
            return;
        }
        self.max_key = limit.saturating_sub(1);
        let gone: Vec<u32> = self
            .map
            .iter()
            .filter(|&(&k, _)| k >= limit)
            .map(|(_, &s)| s)
            .collect();
        for slot in gone {
            self.discard(slot);
        }
    }

    /// Gives back the memory of every unpinned page (`sqlite3_db_release_memory`,
    /// `sqlite3_release_memory`): discarded, then purged now with the rest of the free pages.
    fn shrink(&mut self) {
        if !self.purgeable {
            return;
        }
        while let Some(slot) = self.oldest_unpinned() {
            self.discard(slot);
        }
        for c in &self.chunks {
            // Pinned pages stay: a purge takes volatile ranges only.
            let _ = c.region.purge();
        }
    }
}

/// Runs `f` on the cache under its lock; `fail` if it panicked (nothing unwinds into SQLite).
fn with<T>(cache: *mut c_void, fail: T, f: impl FnOnce(&mut Inner) -> T) -> T {
    if cache.is_null() {
        return fail;
    }
    // SAFETY: SQLite passes back the pointer `x_create` returned, until `x_destroy`.
    let cache = unsafe { &*cache.cast::<Cache>() };
    catch_unwind(AssertUnwindSafe(|| {
        let mut inner = cache.0.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut inner)
    }))
    .unwrap_or(fail)
}

/// The slot of a page this cache handed out.
///
/// # Safety
/// `page` must be a page `x_fetch` returned.
unsafe fn slot_of(page: *mut PcachePage) -> u32 {
    // SAFETY: every page handed out is the first field of a `Page` (repr(C)).
    unsafe { (*page.cast::<Page>()).slot }
}

unsafe extern "C" fn x_init(_: *mut c_void) -> c_int {
    0
}

unsafe extern "C" fn x_shutdown(_: *mut c_void) {}

unsafe extern "C" fn x_create(page_size: c_int, extra: c_int, purgeable: c_int) -> *mut c_void {
    let made = catch_unwind(|| {
        let sys = vrange::page_size();
        let size = usize::try_from(page_size).ok().filter(|&s| s > 0)?;
        let extra = usize::try_from(extra).ok()?;
        let stride = size.checked_next_multiple_of(sys)?;
        let inner = Inner {
            stride,
            extra_words: extra.div_ceil(8),
            purgeable: purgeable != 0,
            max: usize::MAX,
            per_chunk: (CHUNK_BYTES / stride).max(1),
            chunks: Vec::new(),
            free: Vec::new(),
            map: PageMap::default(),
            max_key: 0,
            key: Vec::new(),
            state: Vec::new(),
            unpinned: Lru::new(),
            allocs: 0,
            was_short: false,
        };
        Some(Box::into_raw(Box::new(Cache(Mutex::new(inner)))).cast::<c_void>())
    });
    made.ok().flatten().unwrap_or(null_mut())
}

unsafe extern "C" fn x_cachesize(cache: *mut c_void, n: c_int) {
    with(cache, (), |c| {
        c.max = usize::try_from(n).unwrap_or(0).max(1);
        c.trim(c.max);
    });
}

unsafe extern "C" fn x_pagecount(cache: *mut c_void) -> c_int {
    with(cache, 0, |c| {
        c_int::try_from(c.map.len()).unwrap_or(c_int::MAX)
    })
}

unsafe extern "C" fn x_fetch(cache: *mut c_void, key: c_uint, create: c_int) -> *mut PcachePage {
    with(cache, null_mut(), |c| c.fetch(key, create))
}

unsafe extern "C" fn x_unpin(cache: *mut c_void, page: *mut PcachePage, discard: c_int) {
    // SAFETY: SQLite passes a page this cache handed out.
    let slot = unsafe { slot_of(page) };
    with(cache, (), |c| c.unpin(slot, discard != 0));
}

unsafe extern "C" fn x_rekey(cache: *mut c_void, page: *mut PcachePage, old: c_uint, new: c_uint) {
    // SAFETY: as above.
    let slot = unsafe { slot_of(page) };
    with(cache, (), |c| c.rekey(slot, old, new));
}

unsafe extern "C" fn x_truncate(cache: *mut c_void, limit: c_uint) {
    with(cache, (), |c| c.truncate(limit));
}

unsafe extern "C" fn x_destroy(cache: *mut c_void) {
    if cache.is_null() {
        return;
    }
    // SAFETY: made by `x_create` with Box::into_raw; SQLite destroys a cache once.
    let _ = catch_unwind(|| drop(unsafe { Box::from_raw(cache.cast::<Cache>()) }));
}

unsafe extern "C" fn x_shrink(cache: *mut c_void) {
    with(cache, (), Inner::shrink);
}

#[cfg(test)]
mod tests;
