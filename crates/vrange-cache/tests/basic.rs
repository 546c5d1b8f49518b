//! The cache's answers against the real kernel: hits, misses, explicit purges, pins.

use vrange::Priority;
use vrange_cache::{Cache, Miss, Options};

fn value(i: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|j| (i as usize * 31 + j * 7) as u8 | 1)
        .collect()
}

#[test]
fn hit_miss_replace_remove() {
    let _s = vrange_testkit::serial();
    let c: Cache<u64> = Cache::new(Options::default());
    for i in 0..100 {
        c.insert(i, &value(i, 1000 + i as usize * 13), Priority::Normal)
            .unwrap();
    }
    for i in 0..100 {
        assert_eq!(
            &c.get(&i).unwrap()[..],
            &value(i, 1000 + i as usize * 13)[..]
        );
    }
    assert_eq!(c.lookup(&1000).unwrap_err(), Miss::Absent);
    c.insert(5, b"five", Priority::Low).unwrap();
    assert_eq!(&c.get(&5).unwrap()[..], b"five");
    assert!(c.remove(&5));
    assert!(!c.remove(&5));
    assert_eq!(c.lookup(&5).unwrap_err(), Miss::Absent);
    assert_eq!(c.len(), 99);
    let s = c.stats();
    assert_eq!(s.hits(), 101);
    assert_eq!(s.misses, 2);
    assert!(s.value_bytes() > 0 && s.resident_bytes() >= s.value_bytes());
}

#[test]
fn purged_entries_report_once_and_pinned_ones_survive() {
    let _s = vrange_testkit::serial();
    let c: Cache<u64> = Cache::new(Options::default());
    let big = value(7, 1 << 20);
    c.insert(1, &big, Priority::Normal).unwrap();
    c.insert(2, &value(2, 3000), Priority::DropFirst).unwrap();
    c.insert(3, &value(3, 3000), Priority::Normal).unwrap();
    let held = c.get(&3).unwrap();
    let hits = c.stats().hits();
    assert!(c.contains_key(&1) && !c.contains_key(&99));
    assert_eq!(c.stats().hits(), hits, "contains_key counts no lookup");
    vrange::purge(usize::MAX);
    assert!(
        !c.contains_key(&2),
        "a purge the sweep found shows in contains_key"
    );
    assert_eq!(c.lookup(&1).unwrap_err(), Miss::Purged);
    assert_eq!(c.lookup(&1).unwrap_err(), Miss::Absent);
    assert_eq!(c.lookup(&2).unwrap_err(), Miss::Purged);
    assert_eq!(&held[..], &value(3, 3000)[..]);
    assert_eq!(&c.get(&3).unwrap()[..], &value(3, 3000)[..]);
    drop(held);
    let s = c.stats();
    assert_eq!(s.purged_lookups(), 2);
    assert_eq!(s.purged_bytes(), (1 << 20) + 3000);
    let e = c
        .get_or_insert_with(1, 100, Priority::Normal, |b| b.fill(9))
        .unwrap();
    assert_eq!(&e[..], &[9u8; 100][..]);
}

#[test]
fn an_entry_outlives_its_cache_and_its_slab_goes_with_it() {
    let _s = vrange_testkit::serial();
    let before = vrange::stats().pinned_bytes;
    let c: Cache<u64> = Cache::new(Options::default());
    c.insert(1, &value(1, 5000), Priority::Normal).unwrap();
    let e = c.get(&1).unwrap();
    drop(c);
    assert_eq!(&e[..], &value(1, 5000)[..], "still readable, unchanged");
    drop(e);
    // The slab was held only by the entry: the next flush (a reclaimer tick) frees it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while vrange::stats().pinned_bytes != before {
        assert!(std::time::Instant::now() < deadline, "a region left pinned");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

#[test]
fn an_idle_slab_becomes_volatile_at_the_reclaimers_next_tick() {
    let _s = vrange_testkit::serial();
    // One slab: without probation the hit does not move the value to a second one.
    let c: Cache<u64> = Cache::new(Options {
        probation: false,
        ..Options::default()
    });
    c.insert(1, &value(1, 5000), Priority::Normal).unwrap();
    drop(c.get(&1).unwrap());
    // Held on the cache's behalf after the last reader: not volatile yet...
    let slab = c.stats().mapped_bytes();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while vrange::stats().volatile_bytes < slab {
        assert!(
            std::time::Instant::now() < deadline,
            "the reclaimer's tick should have flushed the idle slab"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // ... and, volatile, a purge takes it (after the regions other tests' caches left in the
    // pool, which are purged first).
    vrange::purge(usize::MAX);
    assert_eq!(c.lookup(&1).unwrap_err(), Miss::Purged);
}

#[test]
fn keys_lists_the_entries_held_and_not_those_known_purged() {
    let _s = vrange_testkit::serial();
    let c: Cache<u64> = Cache::new(Options::default());
    for i in 0..10 {
        c.insert(i, &value(i, 3000), Priority::Normal).unwrap();
    }
    c.insert(100, &value(100, 3000), Priority::DropFirst)
        .unwrap();
    let held = c.get(&3).unwrap();
    assert!(c.remove(&4));
    let mut keys = c.keys();
    keys.sort_unstable();
    assert_eq!(keys, [0, 1, 2, 3, 5, 6, 7, 8, 9, 100]);
    assert_eq!(c.stats().hits(), 1, "keys counts no lookup");
    vrange::purge(usize::MAX);
    // Only the held value's slab survives the purge: its key and its slab-mates' stay.
    let keys = c.keys();
    assert!(keys.contains(&3), "a held value's key is listed: {keys:?}");
    assert!(
        !keys.contains(&100),
        "a purged value's key is not: {keys:?}"
    );
    assert_eq!(keys.len(), c.len(), "keys and len agree");
    drop(held);
}
