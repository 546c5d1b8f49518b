//! Eight threads on a two-core machine mixing lookups, inserts (copied and in place),
//! get-or-insert, removals and held entries (guards pinning their slab, and kept values holding
//! only their pages), while a ninth purges at random: every value read is
//! a whole value its key was given (each carries its key and version and is checked byte for
//! byte), held values never change, and the statistics add up. A stress test, not a benchmark.

mod common;

use common::{check, version_of, write};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::{Duration, Instant};
use vrange::Priority;
use vrange_cache::{Cache, Miss, Options};

const THREADS: u64 = 8;
const KEYS: u64 = 512;
/// The run lasts this long, and longer until the threads have found enough values and purged
/// ones (a slow or emulated machine takes longer to get there), up to `MAX_RUN`: what is
/// checked is what happened, not how fast.
const RUN: Duration = Duration::from_secs(3);
const MAX_RUN: Duration = Duration::from_secs(120);
const ENOUGH_HITS: u64 = 1000;

fn len_of(key: u64, version: u64) -> usize {
    16 + ((key * 131 + version * 17) % 24_000) as usize
}

fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

#[test]
fn eight_threads_mixing_operations_under_purges_read_only_whole_values() {
    let _s = vrange_testkit::serial();
    common::quiet_reclaimer();
    let cache: Cache<u64> = Cache::new(Options {
        slab_bytes: 128 << 10,
        ..Options::default()
    });
    let versions = AtomicU64::new(1);
    let stop = AtomicBool::new(false);
    let (hits, purged, torn) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let purges = AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (cache, versions, stop) = (&cache, &versions, &stop);
            let (hits, purged, torn) = (&hits, &purged, &torn);
            s.spawn(move || {
                let mut dice = 0x9E37_79B9_7F4A_7C15 ^ (t + 1);
                let mut held: Vec<Box<dyn std::ops::Deref<Target = [u8]> + Send>> = Vec::new();
                while !stop.load(Relaxed) {
                    let key = next(&mut dice) % KEYS;
                    let class = [Priority::DropFirst, Priority::Normal][(key % 2) as usize];
                    match next(&mut dice) % 10 {
                        0..=3 => match cache.lookup(&key) {
                            Ok(e) => {
                                hits.fetch_add(1, Relaxed);
                                if version_of(&e, key).is_none() {
                                    torn.fetch_add(1, Relaxed);
                                }
                                match next(&mut dice) % 16 {
                                    _ if held.len() >= 4 => {}
                                    0 => held.push(Box::new(e)),
                                    1 => held.push(Box::new(e.hold())),
                                    _ => {}
                                }
                            }
                            Err(Miss::Purged) => {
                                purged.fetch_add(1, Relaxed);
                            }
                            Err(Miss::Absent) => {}
                        },
                        4..=5 => {
                            let v = versions.fetch_add(1, Relaxed);
                            let mut buf = vec![0; len_of(key, v)];
                            write(&mut buf, key, v);
                            cache.insert(key, &buf, class).expect("insert");
                        }
                        6 => {
                            let v = versions.fetch_add(1, Relaxed);
                            cache
                                .insert_with(key, len_of(key, v), class, |b| write(b, key, v))
                                .expect("insert_with");
                        }
                        7 => {
                            let v = versions.fetch_add(1, Relaxed);
                            let e = cache
                                .get_or_insert_with(key, len_of(key, v), class, |b| {
                                    write(b, key, v)
                                })
                                .expect("get_or_insert_with");
                            if version_of(&e, key).is_none() {
                                torn.fetch_add(1, Relaxed);
                            }
                        }
                        8 => {
                            cache.remove(&key);
                        }
                        _ => {
                            // Held values must not have changed, whatever happened meanwhile.
                            for e in held.drain(..) {
                                let key = u64::from_le_bytes(e[..8].try_into().unwrap());
                                if version_of(&e, key).is_none() {
                                    torn.fetch_add(1, Relaxed);
                                }
                            }
                        }
                    }
                }
                for e in held {
                    let key = u64::from_le_bytes(e[..8].try_into().unwrap());
                    let version = u64::from_le_bytes(e[8..16].try_into().unwrap());
                    if !check(&e, key, version) {
                        torn.fetch_add(1, Relaxed);
                    }
                }
            });
        }
        let (stop, purges) = (&stop, &purges);
        let (hits, purged) = (&hits, &purged);
        s.spawn(move || {
            let start = Instant::now();
            let mut dice = 7u64;
            let enough = || hits.load(Relaxed) >= ENOUGH_HITS && purged.load(Relaxed) > 0;
            while start.elapsed() < RUN || (!enough() && start.elapsed() < MAX_RUN) {
                std::thread::sleep(Duration::from_micros(next(&mut dice) % 3000));
                vrange::purge(match next(&mut dice) % 4 {
                    0 => usize::MAX,
                    n => (n as usize) << 18,
                });
                purges.fetch_add(1, Relaxed);
            }
            stop.store(true, Relaxed);
        });
    });
    let s = cache.stats();
    println!(
        "{} hits, {} purged lookups, {} purges, {} entries, {} KiB resident, {} KiB overhead",
        hits.load(Relaxed),
        purged.load(Relaxed),
        purges.load(Relaxed),
        s.entries,
        s.resident_bytes() >> 10,
        s.overhead_bytes() >> 10
    );
    assert_eq!(
        torn.load(Relaxed),
        0,
        "every value read was whole and right"
    );
    assert!(
        hits.load(Relaxed) >= ENOUGH_HITS,
        "the threads found values (within {MAX_RUN:?})"
    );
    assert!(purged.load(Relaxed) > 0, "and some purged ones");
    // The cache counts these threads' lookups and those inside get_or_insert_with.
    assert!(s.hits() >= hits.load(Relaxed));
    assert!(s.purged_lookups() >= purged.load(Relaxed));
    // Everything left is readable and right, or reported purged.
    for key in 0..KEYS {
        if let Ok(e) = cache.lookup(&key) {
            assert!(version_of(&e, key).is_some(), "key {key} after the run");
        }
    }
}
