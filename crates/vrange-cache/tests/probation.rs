//! Probation (scan resistance): a value not read since its insert goes before every value of
//! its class that was read, whatever their ages; a key requested again after such a purge
//! skips probation; a first hit moves a value exactly once, whole. Real purges
//! (`vrange::purge`: MADV_DONTNEED on the chosen slabs).

mod common;

use common::{check, quiet_reclaimer, value};
use vrange_cache::{Cache, Miss, Options, Priority};

const VALUE: usize = 4096;

fn put(c: &Cache<u64>, keys: std::ops::Range<u64>) {
    for k in keys {
        c.insert(k, &value(k, 0, VALUE), Priority::Normal).unwrap();
    }
}

fn read(c: &Cache<u64>, k: u64) -> Result<bool, Miss> {
    c.lookup(&k).map(|v| check(&v, k, 0))
}

#[test]
fn a_scan_goes_before_older_values_that_were_read() {
    let _s = vrange_testkit::serial();
    quiet_reclaimer();
    let c: Cache<u64> = Cache::new(Options::default());
    // The working set: inserted first (the oldest), and read once, which moves each value
    // off probation.
    put(&c, 0..32);
    for k in 0..32 {
        assert_eq!(read(&c, k), Ok(true), "key {k}");
    }
    assert_eq!(c.stats().classes[2].promoted, 32, "{:?}", c.stats());
    // A scan: 400 keys inserted once, younger than the working set, never read.
    put(&c, 1000..1400);
    // The smallest purge takes the oldest range of the lowest class: a scan slab (probation
    // is purged as a class below), not the working set, which is older.
    assert!(vrange::purge(1) > 0);
    for k in 0..32 {
        assert_eq!(read(&c, k), Ok(true), "the working set stays: key {k}");
    }
    let purged = (1000..1400)
        .filter(|&k| read(&c, k) == Err(Miss::Purged))
        .count();
    assert!(purged > 0, "the scan's oldest slab went");
}

#[test]
fn without_probation_the_oldest_slab_goes_first() {
    let _s = vrange_testkit::serial();
    quiet_reclaimer();
    let c: Cache<u64> = Cache::new(Options {
        probation: false,
        ..Options::default()
    });
    put(&c, 0..32);
    for k in 0..32 {
        assert_eq!(read(&c, k), Ok(true), "key {k}");
    }
    put(&c, 1000..1400);
    assert!(vrange::purge(1) > 0);
    // One LRU order at slab grain: the working set's slab is the oldest.
    assert_eq!(read(&c, 0), Err(Miss::Purged));
    assert_eq!(c.stats().classes[2].promoted, 0);
}

#[test]
fn a_key_requested_again_after_its_probation_purge_skips_probation() {
    let _s = vrange_testkit::serial();
    quiet_reclaimer();
    let c: Cache<u64> = Cache::new(Options::default());
    put(&c, 0..1);
    assert!(vrange::purge(usize::MAX) > 0);
    // The second request finds the tombstone: the key is remembered, and its regeneration
    // goes straight into an ordinary slab.
    assert_eq!(read(&c, 0), Err(Miss::Purged));
    let v = c
        .get_or_insert_with(0, VALUE, Priority::Normal, |b| {
            b.copy_from_slice(&value(0, 0, VALUE))
        })
        .unwrap();
    assert!(check(&v, 0, 0));
    drop(v);
    // Younger probation values: a purge of one range takes one of theirs, not key 0's.
    put(&c, 1000..1100);
    assert!(vrange::purge(1) > 0);
    assert_eq!(read(&c, 0), Ok(true), "key 0 skipped probation");
    assert_eq!(c.stats().classes[2].promoted, 0, "and was not moved");
}

#[test]
fn concurrent_first_hits_move_each_value_once_and_whole() {
    let _s = vrange_testkit::serial();
    quiet_reclaimer();
    let c: Cache<u64> = Cache::new(Options::default());
    const KEYS: u64 = 256;
    put(&c, 0..KEYS);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let c = &c;
            s.spawn(move || {
                for round in 0..20 {
                    for k in 0..KEYS {
                        let k = (k + t * 61 + round) % KEYS;
                        assert_eq!(read(c, k), Ok(true), "key {k}");
                    }
                }
            });
        }
    });
    let st = c.stats();
    assert_eq!(
        st.classes[2].promoted, KEYS,
        "each value moved once: {st:?}"
    );
    assert_eq!(st.entries, KEYS);
    // The values' old places are given up: the probation slabs hold nothing now.
    assert!(
        st.value_bytes() == KEYS * VALUE as u64,
        "value bytes count each value once: {st:?}"
    );
}
