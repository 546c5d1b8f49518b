//! The cache against a plain map (proptest): random inserts, lookups, removals, held entries,
//! explicit purges of everything or of a little, and clears. A value returned is always
//! byte-for-byte the one inserted last under its key; a held entry is never purged and stays
//! as it was; a lookup says `Purged` only after a purge, and `Absent` only when the model has
//! no entry; the statistics count what happened. Held values are guards (which pin their
//! slab: the entry stays a hit), kept values (`Entry::hold`) or raw pointers (`Entry::into_raw`,
//! as the C ABI holds them), which keep only their bytes intact (the entry may be purged
//! around them): a raw release succeeds exactly once per raw hold, and a release of an address
//! with no raw hold left fails and touches no pin; stats show pinned bytes while a value is
//! held, and none when nothing is.

mod common;

use common::{check, quiet_reclaimer, value};
use proptest::prelude::*;
use std::collections::HashMap;
use vrange::Priority;
use vrange_cache::{Cache, Entry, Miss, Options};

#[derive(Debug, Clone)]
enum Op {
    Insert {
        key: u8,
        len: usize,
        class: u8,
    },
    InsertWith {
        key: u8,
        len: usize,
    },
    Get(u8),
    Hold(u8),
    Keep(u8),
    HoldRaw(u8),
    Release(usize),
    /// A raw release of an address released before (or never held): refused unless that
    /// value is still held raw by another hold.
    ReleaseStale(usize),
    Remove(u8),
    PurgeAll,
    PurgeSome(usize),
    Clear,
}

fn len() -> impl Strategy<Value = usize> {
    prop_oneof![
        Just(0usize),
        1usize..64,
        64usize..4096,
        4096usize..40_000,
        // Larger than a quarter of a 64 KiB slab: a region of its own.
        20_000usize..150_000,
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let key = 0u8..24;
    prop_oneof![
        4 => (key.clone(), len(), 0u8..4).prop_map(|(key, len, class)| Op::Insert { key, len, class }),
        1 => (key.clone(), len()).prop_map(|(key, len)| Op::InsertWith { key, len }),
        4 => key.clone().prop_map(Op::Get),
        1 => key.clone().prop_map(Op::Hold),
        1 => key.clone().prop_map(Op::Keep),
        1 => key.clone().prop_map(Op::HoldRaw),
        1 => (0usize..4).prop_map(Op::Release),
        1 => (0usize..8).prop_map(Op::ReleaseStale),
        1 => key.prop_map(Op::Remove),
        1 => Just(Op::PurgeAll),
        1 => (1usize..300_000).prop_map(Op::PurgeSome),
        1 => Just(Op::Clear),
    ]
}

const PRIORITIES: [Priority; 4] = [
    Priority::DropFirst,
    Priority::Low,
    Priority::Normal,
    Priority::DropLast,
];

/// The model's entry: the insert's version, its length, and whether a purge happened since.
#[derive(Debug, Clone, Copy)]
struct Model {
    version: u64,
    len: usize,
    purge_since: bool,
}

/// A value held: through its guard, kept, or given up raw.
enum Held {
    Guard(Entry),
    Kept(vrange_cache::Held),
    Raw(*const u8, usize),
}

impl std::ops::Deref for Held {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Held::Guard(e) => e,
            Held::Kept(k) => k,
            // SAFETY: a raw hold keeps its pin until `Run` releases it (and drops this).
            Held::Raw(p, len) => unsafe { std::slice::from_raw_parts(*p, *len) },
        }
    }
}

struct Run {
    cache: Cache<u64>,
    model: HashMap<u64, Model>,
    held: Vec<(u64, u64, Held)>,
    /// Addresses released raw (and a few that never were values).
    released: Vec<*const u8>,
    version: u64,
    hits: u64,
}

impl Run {
    /// Whether the model's current value under `key` is one a guard pins (kept and raw
    /// values keep only their own bytes, not the entry).
    fn pinned(&self, key: u64) -> bool {
        let Some(m) = self.model.get(&key) else {
            return false;
        };
        self.held
            .iter()
            .any(|(k, v, h)| *k == key && *v == m.version && matches!(h, Held::Guard(_)))
    }

    fn lookup(&mut self, key: u64) -> Option<Entry> {
        let pinned = self.pinned(key);
        match (self.cache.lookup(&key), self.model.get(&key).copied()) {
            (Ok(e), Some(m)) => {
                assert_eq!(e.len(), m.len, "key {key}: length");
                assert!(check(&e, key, m.version), "key {key}: the bytes inserted");
                self.hits += 1;
                Some(e)
            }
            (Ok(_), None) => panic!("key {key}: a value for a key the model does not have"),
            (Err(Miss::Absent), Some(m)) => panic!("key {key}: absent, but the model has {m:?}"),
            (Err(Miss::Absent), None) => None,
            (Err(Miss::Purged), Some(m)) => {
                assert!(
                    m.purge_since,
                    "key {key}: purged with no purge since its insert"
                );
                assert!(!pinned, "key {key}: purged while a held entry pins it");
                self.model.remove(&key);
                None
            }
            (Err(Miss::Purged), None) => panic!("key {key}: purged, but the model has none"),
        }
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Insert { key, len, class } => {
                self.version += 1;
                let key = u64::from(key);
                let v = value(key, self.version, len);
                self.cache
                    .insert(key, &v, PRIORITIES[class as usize])
                    .expect("insert");
                self.model.insert(
                    key,
                    Model {
                        version: self.version,
                        len,
                        purge_since: false,
                    },
                );
            }
            Op::InsertWith { key, len } => {
                self.version += 1;
                let (key, version) = (u64::from(key), self.version);
                self.cache
                    .insert_with(key, len, Priority::Normal, |b| {
                        common::write(b, key, version)
                    })
                    .expect("insert_with");
                self.model.insert(
                    key,
                    Model {
                        version,
                        len,
                        purge_since: false,
                    },
                );
            }
            Op::Get(key) => {
                self.lookup(u64::from(key));
            }
            Op::Hold(key) | Op::Keep(key) | Op::HoldRaw(key) => {
                let key = u64::from(key);
                if self.held.len() < 4 {
                    if let Some(e) = self.lookup(key) {
                        let version = self.model[&key].version;
                        let held = match op {
                            Op::HoldRaw(_) => {
                                let (p, len) = e.into_raw();
                                Held::Raw(p, len)
                            }
                            Op::Keep(_) => Held::Kept(e.hold()),
                            _ => Held::Guard(e),
                        };
                        self.held.push((key, version, held));
                    }
                }
            }
            Op::Release(i) => {
                if i < self.held.len() {
                    if let (_, _, Held::Raw(p, _)) = self.held.remove(i) {
                        assert_eq!(self.cache.release_raw(p), Ok(()), "a raw hold's release");
                        self.released.push(p);
                    }
                }
            }
            Op::ReleaseStale(i) => {
                if let Some(&p) = self.released.get(i) {
                    let raw_holds = self
                        .held
                        .iter()
                        .filter(|(_, _, h)| matches!(h, Held::Raw(q, _) if *q == p))
                        .count();
                    let r = self.cache.release_raw(p);
                    if raw_holds == 0 {
                        assert_eq!(r, Err(vrange::Error::NotRegion), "a stale release");
                    } else {
                        // Another raw hold of the same value: that one is released now.
                        assert_eq!(r, Ok(()));
                        let j = self
                            .held
                            .iter()
                            .position(|(_, _, h)| matches!(h, Held::Raw(q, _) if *q == p))
                            .unwrap();
                        self.held.remove(j);
                    }
                }
            }
            Op::Remove(key) => {
                let key = u64::from(key);
                assert_eq!(
                    self.cache.remove(&key),
                    self.model.remove(&key).is_some(),
                    "remove {key}"
                );
            }
            Op::PurgeAll | Op::PurgeSome(_) => {
                vrange::purge(match *op {
                    Op::PurgeSome(n) => n,
                    _ => usize::MAX,
                });
                for m in self.model.values_mut() {
                    m.purge_since = true;
                }
                // A held value is pinned: still there and unchanged; a guard's is still a hit.
                for (key, version, e) in &self.held {
                    assert!(
                        check(e, *key, *version),
                        "held key {key}: changed by a purge"
                    );
                }
                let keys: Vec<u64> = self
                    .model
                    .keys()
                    .copied()
                    .filter(|&k| self.pinned(k))
                    .collect();
                for key in keys {
                    assert!(self.lookup(key).is_some(), "held key {key}: purged");
                }
            }
            Op::Clear => {
                self.cache.clear();
                self.model.clear();
            }
        }
        for (key, version, e) in &self.held {
            assert!(check(e, *key, *version), "held key {key}: changed");
        }
        // Pinned bytes are written pages of held slabs: some while a non-empty value is held
        // (an empty one need not have written any page), none when nothing is.
        let pinned = self.cache.stats().pinned_bytes();
        if self.held.iter().any(|(_, _, h)| !h.is_empty()) {
            assert!(pinned > 0, "a value is held, but no bytes are shown pinned");
        }
        if self.held.is_empty() {
            assert_eq!(pinned, 0, "nothing is held, but bytes are shown pinned");
        }
    }

    /// Releases every raw hold (guards drop themselves).
    fn release_all(&mut self) {
        for (_, _, h) in self.held.drain(..) {
            if let Held::Raw(p, _) = h {
                assert_eq!(self.cache.release_raw(p), Ok(()));
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn the_cache_agrees_with_a_map(ops in proptest::collection::vec(op(), 1..80)) {
        let _s = vrange_testkit::serial();
        quiet_reclaimer();
        let mut run = Run {
            cache: Cache::new(Options { slab_bytes: 64 << 10, ..Options::default() }),
            model: HashMap::new(),
            held: Vec::new(),
            // Never values: a null pointer and one inside the test's stack.
            released: vec![std::ptr::null(), (&0u8 as *const u8)],
            version: 0,
            hits: 0,
        };
        for op in &ops {
            run.apply(op);
        }
        let s = run.cache.stats();
        prop_assert_eq!(s.hits(), run.hits);
        // Every model entry is still found (or reported purged after a purge).
        let keys: Vec<u64> = run.model.keys().copied().collect();
        for key in keys {
            run.lookup(key);
        }
        run.release_all();
        let s = run.cache.stats();
        prop_assert_eq!(s.pinned_bytes(), 0);
        prop_assert!(s.resident_bytes() >= s.value_bytes());
        prop_assert_eq!(s.entries as usize, run.model.len());
    }
}
