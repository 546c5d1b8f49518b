//! SQLite's side of the contract, played through the methods table as SQLite calls it (the C
//! ABI's tests run SQLite itself on it: `tests/c/test_sqlite.c`).

use super::*;

/// A cache made through the table, destroyed on drop.
struct Pcache(*mut c_void);

const PAGE: usize = 4096;
/// SQLite's `pExtra` (its page header): the first word says whether the page is known.
const EXTRA: usize = 16;

impl Pcache {
    fn new(purgeable: bool) -> Pcache {
        // SAFETY: page and extra sizes as SQLite passes them.
        let c = unsafe { (METHODS.create)(PAGE as c_int, EXTRA as c_int, purgeable.into()) };
        assert!(!c.is_null());
        Pcache(c)
    }

    /// The page `key`, pinned, or `None` (`create`: 0 never, 1 if easy, 2 always).
    fn fetch(&self, key: u32, create: c_int) -> Option<*mut PcachePage> {
        // SAFETY: a live cache of this table.
        let p = unsafe { (METHODS.fetch)(self.0, key, create) };
        (!p.is_null()).then_some(p)
    }

    fn unpin(&self, page: *mut PcachePage, discard: bool) {
        // SAFETY: a page this cache handed out, pinned.
        unsafe { (METHODS.unpin)(self.0, page, discard.into()) }
    }

    fn count(&self) -> c_int {
        // SAFETY: a live cache of this table.
        unsafe { (METHODS.pagecount)(self.0) }
    }
}

impl Drop for Pcache {
    fn drop(&mut self) {
        // SAFETY: made by `create`, destroyed once.
        unsafe { (METHODS.destroy)(self.0) }
    }
}

/// Writes `v` over a page's bytes and the first word of its header, as SQLite fills a page.
fn fill(page: *mut PcachePage, v: u8) {
    // SAFETY: a pinned page of PAGE bytes, with EXTRA bytes of header.
    unsafe {
        std::ptr::write_bytes((*page).buf.cast::<u8>(), v, PAGE);
        (*page).extra.cast::<u64>().write(u64::from(v));
    }
}

/// The page's first byte and its header's first word.
fn read(page: *mut PcachePage) -> (u8, u64) {
    // SAFETY: as in `fill`.
    unsafe {
        (
            *(*page).buf.cast::<u8>(),
            (*page).extra.cast::<u64>().read(),
        )
    }
}

#[test]
fn methods_is_the_version_1_table() {
    assert_eq!(methods(), std::ptr::addr_of!(METHODS).cast());
    assert_eq!(METHODS.version, 1);
}

#[test]
fn a_new_page_is_marked_new_and_a_pinned_page_keeps_its_bytes() {
    let c = Pcache::new(true);
    assert_eq!(c.fetch(7, 0), None, "never created");
    let p = c.fetch(7, 2).unwrap();
    assert_eq!(read(p).1, 0, "a new page's header says so");
    fill(p, 0x5a);
    assert_eq!(c.fetch(7, 0), Some(p), "fetching a pinned page returns it");
    assert_eq!(read(p), (0x5a, 0x5a));
    assert_eq!(c.count(), 1);
}

#[test]
fn a_purged_unpinned_page_comes_back_new_or_absent() {
    let c = Pcache::new(true);
    let p = c.fetch(1, 2).unwrap();
    fill(p, 1);
    c.unpin(p, false);
    let q = c.fetch(2, 2).unwrap();
    fill(q, 2);
    c.unpin(q, false);
    // Every volatile range of this process goes, these two pages among them.
    vrange::purge(usize::MAX);
    assert_eq!(c.fetch(1, 0), None, "asked not to create: reported absent");
    let q = c.fetch(2, 1).unwrap();
    assert_eq!(
        read(q).1,
        0,
        "handed back as a new page, for SQLite to read again"
    );
}

#[test]
fn a_cache_that_is_not_purgeable_never_loses_a_page() {
    let c = Pcache::new(false);
    let p = c.fetch(3, 2).unwrap();
    fill(p, 3);
    c.unpin(p, false);
    vrange::purge(usize::MAX);
    let p = c.fetch(3, 0).expect("kept");
    assert_eq!(read(p), (3, 3));
}

#[test]
fn cache_size_discards_the_oldest_unpinned_pages() {
    let c = Pcache::new(true);
    // SAFETY: a live cache of this table.
    unsafe { (METHODS.cachesize)(c.0, 2) };
    for key in 1..=4 {
        let p = c.fetch(key, 2).unwrap();
        fill(p, key as u8);
        c.unpin(p, false);
    }
    assert_eq!(c.count(), 2);
    assert_eq!(c.fetch(1, 0), None);
    assert_eq!(c.fetch(2, 0), None);
}

#[test]
fn discard_rekey_and_truncate_forget_pages() {
    let c = Pcache::new(false);
    let p = c.fetch(1, 2).unwrap();
    c.unpin(p, true);
    assert_eq!(c.count(), 0, "discarded");
    let p = c.fetch(5, 2).unwrap();
    fill(p, 5);
    // SAFETY: a pinned page of this cache, under its key.
    unsafe { (METHODS.rekey)(c.0, p, 5, 9) };
    assert_eq!(c.fetch(5, 0), None);
    assert_eq!(c.fetch(9, 0), Some(p));
    assert_eq!(read(p), (5, 5));
    c.unpin(p, false);
    let q = c.fetch(3, 2).unwrap();
    c.unpin(q, false);
    // SAFETY: a live cache of this table.
    unsafe { (METHODS.truncate)(c.0, 4) };
    assert_eq!(c.fetch(9, 0), None, "at or above the limit: gone");
    assert!(c.fetch(3, 0).is_some(), "below it: kept");
}
