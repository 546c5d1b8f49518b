//! Merge-based eviction: the cache's own evictions take the oldest slab whole but carry the
//! values read since they were written, byte for byte; a lookup racing a carry never reports
//! a carried value purged. Against the real kernel: the evicted slabs' regions are purged
//! (MADV_DONTNEED) and unmapped.

mod common;

use common::{check, quiet_reclaimer, value};
use std::collections::HashSet;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use vrange_cache::{Cache, Miss, Options, Priority};

const VALUE: usize = 4000;
const SLAB: usize = 64 << 10;

fn put(c: &Cache<u64>, keys: std::ops::Range<u64>) {
    for k in keys {
        c.insert(k, &value(k, 0, VALUE), Priority::Normal).unwrap();
    }
}

/// A cache of eight 64 KiB slabs' budget, without probation (every value goes straight into
/// the slabs evictions take in the order they were made).
fn cache() -> Cache<u64> {
    Cache::new(Options {
        slab_bytes: SLAB,
        budget: Some(8 * SLAB),
        probation: false,
        ..Options::default()
    })
}

#[test]
fn an_evicted_slab_keeps_the_values_read_since_they_were_written() {
    let _s = vrange_testkit::serial();
    quiet_reclaimer();
    let c = cache();
    // The first slab's values (at least 15 of 4000 bytes fit behind any colour).
    put(&c, 0..15);
    let read: Vec<u64> = (0..15).filter(|k| k % 3 == 0).collect();
    for &k in &read {
        assert!(check(&c.get(&k).expect("a fresh value"), k, 0), "key {k}");
    }
    // Eight more slabs' worth: the budget evicts the oldest slabs, the first among them.
    put(&c, 100..100 + 8 * 16);
    let stats = c.stats().classes[Priority::Normal as usize];
    assert!(
        stats.carried >= read.len() as u64,
        "the read values were carried: {stats:?}"
    );
    assert!(
        c.stats().resident_bytes() <= 8 * SLAB as u64 + SLAB as u64,
        "the budget holds"
    );
    for k in 0..15 {
        let got = c.lookup(&k);
        if read.contains(&k) {
            let v = got.unwrap_or_else(|m| panic!("read key {k} was evicted: {m:?}"));
            assert!(
                check(&v, k, 0),
                "key {k}: the carried bytes are the value's"
            );
        } else {
            assert_eq!(
                got.err(),
                Some(Miss::Purged),
                "unread key {k} went with its slab"
            );
        }
    }
    // A carried value was counted as carried, not purged.
    let stats = c.stats().classes[Priority::Normal as usize];
    assert_eq!(
        stats.purged_lookups,
        (15 - read.len()) as u64,
        "purged lookups are the unread keys: {stats:?}"
    );
}

/// Readers hammer values that evictions keep carrying. A lookup that finds a slab dead just as
/// its value is carried looks again (`Cache::lookup`); that window is a few instructions wide,
/// so this checks the outcome under a real race rather than forcing the interleaving.
#[test]
fn readers_racing_carries_see_right_bytes_and_a_purge_once_and_for_good() {
    let _s = vrange_testkit::serial();
    quiet_reclaimer();
    let c = cache();
    const HOT: u64 = 64;
    put(&c, 0..HOT);
    let stop = AtomicBool::new(false);
    let started = std::sync::Barrier::new(3);
    std::thread::scope(|s| {
        let (c, stop, started) = (&c, &stop, &started);
        // Readers: a value is right; a purge is final (no one inserts these keys again), so
        // a key reported purged must then be absent, never found.
        let readers: Vec<_> = (0..2)
            .map(|r| {
                s.spawn(move || {
                    let mut gone = HashSet::new();
                    let (mut hits, mut purged) = (0u64, 0u64);
                    // Every hot value read once before the writer starts: the first
                    // evictions of their slabs carry them, however the threads are scheduled.
                    for k in (r..HOT).step_by(2) {
                        assert!(check(&c.get(&k).expect("a fresh value"), k, 0), "key {k}");
                    }
                    started.wait();
                    while !stop.load(Relaxed) {
                        for k in (r..HOT).step_by(2) {
                            match c.lookup(&k) {
                                Ok(v) => {
                                    assert!(!gone.contains(&k), "key {k} found after its purge");
                                    assert!(check(&v, k, 0), "key {k}: wrong bytes");
                                    hits += 1;
                                }
                                Err(Miss::Purged) => {
                                    assert!(gone.insert(k), "key {k} purged twice");
                                    purged += 1;
                                }
                                Err(Miss::Absent) => {
                                    assert!(gone.contains(&k), "key {k} absent, never purged")
                                }
                            }
                        }
                    }
                    (hits, purged)
                })
            })
            .collect();
        started.wait();
        // The writer: new keys only, a hundred budgets' worth, so evictions carry the hot values
        // again and again while the readers look them up.
        put(c, 1000..1000 + 100 * 8 * 16);
        stop.store(true, Relaxed);
        let (mut hits, mut purged) = (0, 0);
        for r in readers {
            let (h, p) = r.join().expect("a reader failed");
            hits += h;
            purged += p;
        }
        let carried = c.stats().classes[Priority::Normal as usize].carried;
        println!("hits {hits}, purged {purged}, carried {carried}");
        assert!(carried > 0, "evictions carried read values");
    });
}
