//! A page cache for SQLite ([`methods`]: a `sqlite3_pcache_methods2`, installed with
//! `sqlite3_config(SQLITE_CONFIG_PCACHE2, ...)` before SQLite starts; the C ABI exports it as
//! `vrange_sqlite_pcache()`) whose unpinned pages are volatile: the system may take them back
//! under memory pressure, in the same global order as all other vrange memory, and SQLite reads
//! a taken page from its file again, as it would after its own cache evicted it.
//!
//! - Pages live in hybrid regions (vrange's default policy) of about 256 KiB, one volatile
//!   range per page (a page's stride is its size rounded up to a system page: pages under
//!   4 KiB waste the rest). Near the memory cgroup's limit the reclaimer keeps the coldest
//!   volatile pages armed (the *armed reserve*, `vrange::short`), which the kernel takes by
//!   itself when a neighbour charges memory faster than the reclaimer purges.
//! - A page SQLite unpins is *held* first: unpinned but not volatile, so that SQLite fetching
//!   it again (the b-trees' upper levels, a cursor's leaf: most fetches) changes no range's
//!   state. It becomes volatile once idle for `vrange::reclaimer::HOT` (50 ms; its next mark
//!   then never follows the previous one within `HOT`, so it is never a *hot* mark, which the
//!   armed reserve would pass over), or at once when more than 4 MiB of pages are held (the
//!   oldest first); an idle cache's held pages become volatile at the reclaimer's next tick
//!   or purge (a flush hook). At most 4 MiB of a cache is thus neither SQLite's nor volatile,
//!   for at most 50 ms and a tick.
//! - `xFetch` of a volatile page unmarks it, and if the system took it (exact detection), hands
//!   it back as a new page (the first word of `pExtra` zeroed, as SQLite's own cache does, so
//!   SQLite reads it from the file), or, when asked not to create pages, reports it absent.
//! - SQLite's per-page header (`pExtra`) lives in ordinary memory, never purged, beside the
//!   cache's record of the page (on the cache line after it), and
//!   records are linked by pointer as SQLite's own cache links its own: a fetch reads one hash
//!   bucket and one record.
//! - Only clean pages are unpinned by SQLite; pages of a cache that is not purgeable
//!   (`:memory:` and temporary databases, `bPurgeable == 0`) are never marked volatile: they
//!   hold the only copy of their data.
//! - Keeping the pages: while memory is short for the next 16 pages (`vrange::short`: they
//!   would leave the memory cgroup's free memory under the headroom threshold; two `pread`s,
//!   every 16 new pages), a new page takes the record of the cache's
//!   oldest unpinned page, memory already charged, instead of charging more (see
//!   `Inner::alloc`).
//! - `cache_size` is honoured as SQLite's own cache honours it (unpinned pages beyond it are
//!   discarded oldest first); set it large and let memory pressure bound the cache.
//! - Each cache has its own lock (a flag: SQLite calls one cache from one thread at a time,
//!   and the flush hook only tries it); several caches may be called from several threads.
//!
//! It never links SQLite: the methods table and the page it hands out are built by their C
//! layout in sqlite3.h, and SQLite is whichever the program uses. No panic reaches SQLite.

#![deny(unsafe_op_in_unsafe_fn)]

mod cache;
mod lock;
mod records;

use cache::{Cache, Inner};
use libc::{c_int, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::null_mut;

/// `sqlite3_pcache_page` of sqlite3.h.
#[repr(C)]
struct PcachePage {
    buf: *mut c_void,
    extra: *mut c_void,
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

/// Runs `f` on the cache under its lock; `fail` if it panicked (nothing unwinds into SQLite).
fn with<T>(cache: *mut c_void, fail: T, f: impl FnOnce(&mut Inner) -> T) -> T {
    if cache.is_null() {
        return fail;
    }
    // SAFETY: SQLite passes back the pointer `x_create` returned, until `x_destroy`.
    let cache = unsafe { &*cache.cast::<Cache>() };
    catch_unwind(AssertUnwindSafe(|| f(&mut cache.lock()))).unwrap_or(fail)
}

unsafe extern "C" fn x_init(_: *mut c_void) -> c_int {
    0
}

unsafe extern "C" fn x_shutdown(_: *mut c_void) {}

unsafe extern "C" fn x_create(page_size: c_int, extra: c_int, purgeable: c_int) -> *mut c_void {
    catch_unwind(|| Cache::new(page_size, extra, purgeable != 0))
        .ok()
        .flatten()
        .map_or(null_mut(), |c| Box::into_raw(Box::new(c)).cast())
}

unsafe extern "C" fn x_cachesize(cache: *mut c_void, n: c_int) {
    with(cache, (), |c| c.set_max(usize::try_from(n).unwrap_or(0)));
}

unsafe extern "C" fn x_pagecount(cache: *mut c_void) -> c_int {
    with(cache, 0, |c| {
        c_int::try_from(c.count()).unwrap_or(c_int::MAX)
    })
}

unsafe extern "C" fn x_fetch(cache: *mut c_void, key: c_uint, create: c_int) -> *mut PcachePage {
    with(cache, null_mut(), |c| c.fetch(key, create))
}

unsafe extern "C" fn x_unpin(cache: *mut c_void, page: *mut PcachePage, discard: c_int) {
    // SAFETY: SQLite passes a page this cache handed out.
    with(cache, (), |c| unsafe { c.unpin(page, discard != 0) });
}

unsafe extern "C" fn x_rekey(cache: *mut c_void, page: *mut PcachePage, old: c_uint, new: c_uint) {
    // SAFETY: as above.
    with(cache, (), |c| unsafe { c.rekey(page, old, new) });
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
