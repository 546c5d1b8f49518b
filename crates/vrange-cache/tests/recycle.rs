//! Recycling: a cache at its budget takes the pages of its own least recently used slab for a
//! new one instead of purging it and faulting fresh pages in. The recycled slab's entries read
//! as purged (never as the new values written over them), a pinned slab is never taken, and
//! the inserts past the budget fault (almost) nothing in.

mod common;

use common::{check, quiet_reclaimer, value};
use vrange_cache::{Cache, Miss, Options, Priority};

const SLAB: usize = 64 << 10;
const BUDGET: usize = 16 * SLAB;
const VALUE: usize = 4000;

fn minor_faults() -> i64 {
    vrange_testkit::procfs::page_faults().0 as i64
}

#[test]
fn a_cache_at_its_budget_recycles_its_oldest_slab_and_its_entries_read_purged() {
    let _s = vrange_testkit::serial();
    quiet_reclaimer();
    let c: Cache<u64> = Cache::new(Options {
        slab_bytes: SLAB,
        budget: Some(BUDGET),
        probation: false,
        ..Options::default()
    });
    // Four times the budget; key 0's entry stays pinned throughout, so its slab (the oldest)
    // is never taken.
    let keys = (4 * BUDGET / VALUE) as u64;
    c.insert(0, &value(0, 0, VALUE), Priority::Normal).unwrap();
    let held = c.get(&0).expect("just inserted");
    let (mut faults, mut pages) = (0, 0);
    for k in 1..keys {
        let before = minor_faults();
        c.insert(k, &value(k, 0, VALUE), Priority::Normal).unwrap();
        if k > keys / 2 {
            faults += minor_faults() - before;
            pages += VALUE.div_ceil(4096) as i64;
        }
    }
    let s = c.stats();
    let recycled = s.classes[Priority::Normal as usize].recycled;
    assert!(recycled > 0, "the cache recycled no slab: {s:?}");
    assert!(
        s.mapped_bytes() <= (BUDGET + 8 * SLAB) as u64,
        "recycling keeps the cache near its budget: {} bytes mapped",
        s.mapped_bytes()
    );
    assert!(
        faults * 4 < pages,
        "inserts into recycled slabs fault little in: {faults} faults for {pages} pages written"
    );
    assert!(check(&held, 0, 0), "the pinned value is intact");
    drop(held);
    // Every entry reads right or purged; the recent ones are all there.
    let (mut present, mut purged) = (0u64, 0u64);
    for k in 0..keys {
        match c.lookup(&k) {
            Ok(v) => {
                assert!(check(&v, k, 0), "key {k} reads another value's bytes");
                present += 1;
            }
            Err(Miss::Purged) => purged += 1,
            Err(Miss::Absent) => panic!("key {k} absent: it was inserted and not removed"),
        }
    }
    assert!(
        purged > 0 && present > 0,
        "{present} present, {purged} purged"
    );
    for k in keys - 100..keys {
        assert!(c.contains_key(&k), "the newest key {k} was recycled");
    }
}

#[test]
fn a_slab_pinned_after_it_was_chosen_is_not_recycled() {
    let _s = vrange_testkit::serial();
    quiet_reclaimer();
    let c: Cache<u64> = Cache::new(Options {
        slab_bytes: SLAB,
        budget: Some(BUDGET),
        probation: false,
        ..Options::default()
    });
    // Past the budget: the cache has recycled, and its scan has chosen the next candidates.
    let mut k = 0u64;
    while c.stats().classes[Priority::Normal as usize].recycled == 0 {
        c.insert(k, &value(k, 0, VALUE), Priority::Normal).unwrap();
        k += 1;
    }
    // Readers now pin every value there is, candidates' slabs included; then the cache goes
    // on inserting past its budget.
    let held: Vec<_> = (0..k).filter_map(|key| Some((key, c.get(&key)?))).collect();
    assert!(!held.is_empty());
    for key in k..k + (2 * BUDGET / VALUE) as u64 {
        c.insert(key, &value(key, 0, VALUE), Priority::Normal)
            .unwrap();
    }
    for (key, v) in &held {
        assert!(
            check(v, *key, 0),
            "a pinned value of key {key} was overwritten"
        );
    }
}
