//! SQLite's side of the contract, played through the methods table as SQLite calls it (the C
//! ABI's tests run SQLite itself on it: `tests/c/test_sqlite.c`, `tests/c/sqlite_stress.c`).
//!
//! Other tests of this process may purge every volatile range at any moment
//! (`vrange::purge`), so a test may count on an unpinned page only while it is held (let go
//! less than `HOT` ago, within the newest `HELD_BYTES`) or in a cache that is not purgeable.

use super::*;
use proptest::prelude::*;
use std::collections::HashMap;
use vrange::reclaimer::HOT;

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

    fn rekey(&self, page: *mut PcachePage, old: u32, new: u32) {
        // SAFETY: a page of this cache, under key `old`.
        unsafe { (METHODS.rekey)(self.0, page, old, new) }
    }

    fn truncate(&self, limit: u32) {
        // SAFETY: a live cache of this table.
        unsafe { (METHODS.truncate)(self.0, limit) }
    }

    fn cache_size(&self, pages: c_int) {
        // SAFETY: a live cache of this table.
        unsafe { (METHODS.cachesize)(self.0, pages) }
    }

    fn count(&self) -> c_int {
        // SAFETY: a live cache of this table.
        unsafe { (METHODS.pagecount)(self.0) }
    }

    /// Runs this cache's clock `HOT` ahead: pages let go before are no longer held for their
    /// age (the next unpin or flush makes them volatile).
    fn age(&self) {
        with(self.0, (), |c| c.age(HOT));
    }

    /// Fetches `key` (creating it), fills it with `v` and unpins it.
    fn put(&self, key: u32, v: u8) {
        let p = self.fetch(key, 2).unwrap();
        fill(p, v);
        self.unpin(p, false);
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

/// The page's first and last bytes and its header's first word.
fn read(page: *mut PcachePage) -> (u8, u8, u64) {
    // SAFETY: as in `fill`.
    unsafe {
        let buf = (*page).buf.cast::<u8>();
        (*buf, *buf.add(PAGE - 1), (*page).extra.cast::<u64>().read())
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
    assert_eq!(read(p).2, 0, "a new page's header says so");
    fill(p, 0x5a);
    assert_eq!(c.fetch(7, 0), Some(p), "fetching a pinned page returns it");
    vrange::purge(usize::MAX);
    assert_eq!(read(p), (0x5a, 0x5a, 0x5a), "pinned: never purged");
    assert_eq!(c.count(), 1);
}

#[test]
fn a_purged_unpinned_page_comes_back_new_or_absent() {
    let c = Pcache::new(true);
    c.put(1, 1);
    c.put(2, 2);
    // Idle for HOT: the purge's flush makes them volatile, then every volatile range of this
    // process goes, these two pages among them.
    c.age();
    vrange::purge(usize::MAX);
    assert_eq!(c.fetch(1, 0), None, "asked not to create: reported absent");
    let q = c.fetch(2, 1).unwrap();
    assert_eq!(
        read(q).2,
        0,
        "handed back as a new page, for SQLite to read again"
    );
}

#[test]
fn a_page_let_go_a_moment_ago_is_held_not_volatile() {
    let c = Pcache::new(true);
    c.put(3, 3);
    let before = vrange::stats().volatile_bytes;
    vrange::purge(usize::MAX);
    let p = c.fetch(3, 0).expect("held: not purged");
    assert_eq!(read(p), (3, 3, 3));
    c.unpin(p, false);
    // Fetched and let go again and again within HOT: no range changes state.
    for _ in 0..1000 {
        let p = c.fetch(3, 0).unwrap();
        c.unpin(p, false);
    }
    assert!(
        vrange::stats().volatile_bytes <= before,
        "nothing of this cache became volatile"
    );
}

#[test]
fn held_pages_beyond_the_cap_are_volatile_at_once_oldest_first() {
    let c = Pcache::new(true);
    let held = super::cache::HELD_BYTES / PAGE;
    let n = (held + 8) as u32;
    let started = std::time::Instant::now();
    for key in 1..=n {
        c.put(key, key as u8 | 1);
    }
    vrange::purge(usize::MAX);
    for key in 1..=8 {
        assert_eq!(
            c.fetch(key, 0),
            None,
            "page {key}: past the cap, volatile, purged"
        );
    }
    // The held ones stay, but a held page idle for HOT turns volatile before any purge, this
    // one or another test's while this loop runs: on a machine slow enough (an emulated guest
    // under load) the oldest of them may have gone too, oldest first. Fetched newest first, so
    // that the pages still held while it runs are always the oldest.
    let mut kept: Vec<bool> = (9..=n)
        .rev()
        .map(|key| match c.fetch(key, 0) {
            Some(p) => {
                assert_eq!(read(p).0, key as u8 | 1, "page {key} intact");
                true
            }
            None => false,
        })
        .collect();
    let took = started.elapsed();
    kept.reverse();
    let first_kept = kept.iter().position(|k| *k).unwrap_or(kept.len());
    assert!(
        kept[first_kept..].iter().all(|k| *k),
        "held pages went oldest first: {kept:?}"
    );
    if took < vrange::reclaimer::HOT {
        assert_eq!(first_kept, 0, "every held page stayed ({took:?})");
    }
}

#[test]
fn an_idle_cache_gives_its_held_pages_to_the_system_at_the_next_flush() {
    let c = Pcache::new(true);
    c.put(5, 5);
    c.age();
    // No call of SQLite's since: only the flush hook (run by the purge) can make it volatile.
    vrange::purge(usize::MAX);
    assert_eq!(c.fetch(5, 0), None);
}

#[test]
fn a_cache_that_is_not_purgeable_never_loses_a_page() {
    let c = Pcache::new(false);
    c.put(3, 3);
    c.age();
    vrange::purge(usize::MAX);
    let p = c.fetch(3, 0).expect("kept");
    assert_eq!(read(p), (3, 3, 3));
}

#[test]
fn cache_size_discards_the_oldest_unpinned_pages() {
    let c = Pcache::new(true);
    c.cache_size(2);
    for key in 1..=4 {
        c.put(key, key as u8);
    }
    assert_eq!(c.count(), 2);
    assert_eq!(c.fetch(1, 0), None);
    assert_eq!(c.fetch(2, 0), None);
    assert!(c.fetch(4, 0).is_some(), "the newest kept");
}

#[test]
fn discard_rekey_and_truncate_forget_pages() {
    let c = Pcache::new(false);
    let p = c.fetch(1, 2).unwrap();
    c.unpin(p, true);
    assert_eq!(c.count(), 0, "discarded");
    let p = c.fetch(5, 2).unwrap();
    fill(p, 5);
    c.rekey(p, 5, 9);
    assert_eq!(c.fetch(5, 0), None);
    assert_eq!(c.fetch(9, 0), Some(p));
    assert_eq!(read(p), (5, 5, 5));
    c.unpin(p, false);
    c.put(3, 3);
    c.truncate(4);
    assert_eq!(c.fetch(9, 0), None, "at or above the limit: gone");
    assert!(c.fetch(3, 0).is_some(), "below it: kept");
}

#[test]
fn thousands_of_pages_are_found_through_every_growth_of_the_hash() {
    let c = Pcache::new(false);
    // Dense page numbers, as SQLite's are, then a few strided ones (sharing buckets).
    let keys: Vec<u32> = (1..=3000).chain((1..=300).map(|k| k * 4096)).collect();
    for &k in &keys {
        c.put(k, (k % 251) as u8 | 1);
    }
    assert_eq!(c.count(), keys.len() as c_int);
    for &k in &keys {
        let p = c.fetch(k, 0).unwrap_or_else(|| panic!("page {k}"));
        assert_eq!(read(p).0, (k % 251) as u8 | 1);
        c.unpin(p, false);
    }
    // A rekey onto a page that exists replaces it.
    let p = c.fetch(7, 0).unwrap();
    c.rekey(p, 7, 8);
    assert_eq!(read(c.fetch(8, 0).unwrap()).0, 7);
    assert_eq!(c.count(), keys.len() as c_int - 1);
    c.truncate(2000);
    assert_eq!(c.count(), 1998, "pages 1 to 1999, 7 moved to 8");
    assert_eq!(c.fetch(4096, 0), None);
}

/// What SQLite may do to a cache, for the model test.
#[derive(Debug, Clone)]
enum Op {
    Fetch {
        key: u32,
        create: c_int,
    },
    Unpin {
        at: usize,
        discard: bool,
    },
    Rekey {
        at: usize,
        to: u32,
    },
    Truncate(u32),
    CacheSize(c_int),
    Purge,
    /// `HOT` passes: pages let go before are due to become volatile.
    Age,
    Write {
        at: usize,
        v: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let key = 1u32..48;
    prop_oneof![
        6 => (key.clone(), 0..3).prop_map(|(key, create)| Op::Fetch { key, create }),
        5 => (0usize..8, prop::bool::weighted(0.1)).prop_map(|(at, discard)| Op::Unpin { at, discard }),
        1 => (0usize..8, key.clone()).prop_map(|(at, to)| Op::Rekey { at, to }),
        1 => (1u32..60).prop_map(Op::Truncate),
        1 => (1..64).prop_map(Op::CacheSize),
        2 => Just(Op::Purge),
        2 => Just(Op::Age),
        3 => (0usize..8, 1u8..=255).prop_map(|(at, v)| Op::Write { at, v }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The cache against a plain map: SQLite's calls at random, with time passing and purges
    /// of every volatile range. A page SQLite holds is never lost and keeps its bytes; a page it let go comes
    /// back with the bytes it had, or new (its header zeroed), or absent when not to be
    /// created, never with other bytes; the page count is at least the pinned pages and at
    /// most the pages known.
    #[test]
    fn the_cache_matches_a_map(purgeable: bool, ops in prop::collection::vec(op(), 1..200)) {
        let c = Pcache::new(purgeable);
        // key -> the byte its page holds (0: new, SQLite has not filled it yet).
        let mut model: HashMap<u32, u8> = HashMap::new();
        // Pages SQLite holds: (key, page).
        let mut pinned: Vec<(u32, *mut PcachePage)> = Vec::new();
        let mut max = usize::MAX;
        for op in ops {
            match op {
                Op::Fetch { key, create } => {
                    if let Some(&(_, p)) = pinned.iter().find(|(k, _)| *k == key) {
                        prop_assert_eq!(c.fetch(key, create), Some(p), "a pinned page is itself");
                        continue;
                    }
                    match (c.fetch(key, create), model.get(&key).copied()) {
                        (None, known) => {
                            prop_assert!(
                                create == 0 || (create == 1 && purgeable && pinned.len() >= max),
                                "page {} refused (create {})", key, create
                            );
                            prop_assert!(known.is_none() || purgeable, "page {} lost", key);
                            model.remove(&key);
                        }
                        (Some(p), known) => {
                            let (b, e, h) = read(p);
                            match known {
                                Some(v) if h != 0 => prop_assert_eq!(
                                    (b, e, h), (v, v, u64::from(v)), "page {} intact", key
                                ),
                                Some(_) => prop_assert!(purgeable, "page {} lost", key),
                                None => prop_assert!(create != 0 && h == 0, "page {} new", key),
                            }
                            if h == 0 {
                                model.insert(key, 0);
                            }
                            pinned.push((key, p));
                        }
                    }
                }
                Op::Unpin { at, discard } => {
                    if pinned.is_empty() { continue; }
                    let (key, p) = pinned.remove(at % pinned.len());
                    if model.get(&key) == Some(&0) {
                        // SQLite never leaves a page it did not fill: it discards it.
                        c.unpin(p, true);
                        model.remove(&key);
                    } else {
                        c.unpin(p, discard);
                        if discard { model.remove(&key); }
                    }
                }
                Op::Write { at, v } => {
                    if pinned.is_empty() { continue; }
                    let (key, p) = pinned[at % pinned.len()];
                    fill(p, v);
                    model.insert(key, v);
                }
                Op::Rekey { at, to } => {
                    if pinned.is_empty() { continue; }
                    let i = at % pinned.len();
                    let (key, p) = pinned[i];
                    if key == to || pinned.iter().any(|(k, _)| *k == to) { continue; }
                    // SQLite discards the page at `to` first (sqlite3PcacheMove).
                    if let Some(q) = c.fetch(to, 0) {
                        c.unpin(q, true);
                    }
                    c.rekey(p, key, to);
                    model.remove(&to);
                    let v = model.remove(&key).unwrap_or(0);
                    model.insert(to, v);
                    pinned[i].0 = to;
                }
                Op::Truncate(limit) => {
                    // SQLite truncates only above pages it holds.
                    if pinned.iter().any(|(k, _)| *k >= limit) { continue; }
                    c.truncate(limit);
                    model.retain(|&k, _| k < limit);
                    for k in model.keys() {
                        prop_assert!(*k < limit);
                    }
                }
                Op::CacheSize(n) => {
                    c.cache_size(n);
                    max = n as usize;
                }
                Op::Purge => {
                    vrange::purge(usize::MAX);
                }
                Op::Age => c.age(),
            }
            let n = c.count() as usize;
            prop_assert!(n >= pinned.len() && n <= model.len(),
                "count {} with {} pinned, {} known", n, pinned.len(), model.len());
        }
        for (_, p) in pinned {
            c.unpin(p, false);
        }
    }
}
