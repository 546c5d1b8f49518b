//! cache: `vrange_cache::Cache`, whose values the system takes back under memory pressure,
//! beside the fixed-capacity caches a Rust service would use instead: moka (`sync`),
//! quick_cache (`sync`) and lru (behind a mutex), each with its defaults.
//!
//! Two parts, each peer in a process of its own (`vrange-bench role cache ...`):
//! - The hot path (`hot PEER SIZE OPS RUNS`): 64 MiB of values of 1 KiB, 64 KiB and 1 MiB
//!   under `u64` keys. Inserts (values copied in, a fresh cache per run, keys split between
//!   the threads) and hits (get a present key, read the value's first and last byte, drop the
//!   handle: `Entry` for vrange-cache, an `Arc<[u8]>` clone for the peers), at 1 and 2
//!   threads, the median of several runs. The peers' capacity is twice the working set, so
//!   nothing is evicted. The target: a vrange-cache hit within 1.5× of the fastest
//!   peer's.
//! - The scenario that matters: in one fresh child memory cgroup per peer, a *service*
//!   (`service PEER CAPACITY KEYS EPOCH END ZIPF`) answers requests for keys drawn from a
//!   Zipf-like law over a key space whose values total three times the limit: a hit checks
//!   every byte of the value, a miss regenerates it (a pattern from the key) and inserts it.
//!   Beside it a neighbour (`role neighbour`, shared with the coordinate suite) holds no
//!   memory during the warm-up, then ramps its resident memory 0 → 60 % of the limit → 0 (a
//!   raised cosine)
//!   and is spared by the OOM killer (the service makes itself its first choice,
//!   `oom_score_adj` 1000), as a neighbour an operator cares about would be. Peers:
//!   quick_cache sized for the container (the limit less an eighth for the process: expect
//!   OOM kills while the hog is up; the service is restarted after `RESTART`, as a
//!   supervisor would), quick_cache sized conservatively (the limit less the hog's peak less
//!   the same eighth: hit rate lost), and vrange-cache with no capacity (vrange's reclaimer,
//!   default settings). Reported per peer: the hit rate in
//!   every second, overall and while the hog is above half its peak, OOM kills and when,
//!   peak cgroup memory, wrong values (must be 0). The targets: no OOM kill for
//!   vrange-cache, and its hit rate in every second at least the conservative peer's.
//!
//! The scenario needs root and a memory cgroup; without them it is skipped and the hot path
//! still runs.

mod hot;
mod scenario;
mod trace;

use super::neighbour::{Neighbour, Ramp};
use super::plot::{self, Axis, Series, Unit};
use super::report::{self, mib, pct, progress, Csv, Table};
use super::service::{
    headroom, plot_over_time, sleep_until, supervise, wrong_row, Rng, Sample, Samples, Second,
    Seconds, Zipf, MIB, RESTART, SEC,
};
use super::Ctx;
use hot::{hot_path, hot_role};
pub(crate) use scenario::keys_for;
pub(super) use scenario::vrange_cache_run;
use scenario::{scenario, service_role};
use std::mem::MaybeUninit;
use std::sync::{Arc, Barrier, Mutex, PoisonError};
use std::time::{Duration, Instant};
use vrange::Priority;
use vrange_cache::{Cache, Miss, Options};
use vrange_sys::clock::now_ns;
use vrange_testkit::proc::{clean_command, Exit, Proc};
use vrange_testkit::role::field;
use vrange_testkit::{cgroup, procfs};

/// Value sizes of the hot path, and the bytes of values held per size.
const SIZES: [usize; 3] = [1 << 10, 64 << 10, 1 << 20];
const WORKING_SET: usize = 64 << 20;
const THREADS: [usize; 2] = [1, 2];
/// The hot path's peers: role name, what it is.
const PEERS: [(&str, &str); 4] = [
    (
        "vrange-cache",
        "vrange_cache::Cache<u64> (a hit returns a pinned Entry)",
    ),
    (
        "moka",
        "moka::sync::Cache<u64, Arc<[u8]>>, weighed in bytes",
    ),
    (
        "quick_cache",
        "quick_cache::sync::Cache<u64, Arc<[u8]>>, weighed in bytes",
    ),
    ("lru", "Mutex<lru::LruCache<u64, Arc<[u8]>>>"),
];
/// The target: a hit within this factor of the fastest peer's.
const HIT_TARGET: f64 = 1.5;
/// The neighbour's peak, in percent of the limit.
const NEIGHBOUR_PERCENT: u64 = 60;
/// The Zipf exponent of the service's keys.
pub(crate) const ZIPF: f64 = 0.8;

// ---------------------------------------------------------------------------------------
// Values: a cheap deterministic pattern per key, checkable word by word.

/// Word `i` of key `key`'s value.
#[inline]
fn word(key: u64, i: usize) -> u64 {
    key.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ i as u64
}

/// Writes key `key`'s value into `buf` (the regeneration a miss costs).
pub(super) fn fill(key: u64, buf: &mut [u8]) {
    let mut words = buf.chunks_exact_mut(8);
    for (i, w) in words.by_ref().enumerate() {
        w.copy_from_slice(&word(key, i).to_le_bytes());
    }
    let rest = words.into_remainder();
    let last = word(key, usize::MAX).to_le_bytes();
    rest.copy_from_slice(&last[..rest.len()]);
}

/// Whether `v` is key `key`'s value of `len` bytes (every byte read).
pub(super) fn check(key: u64, len: usize, v: &[u8]) -> bool {
    if v.len() != len {
        return false;
    }
    let words = v.chunks_exact(8);
    let rest = words.remainder();
    let diff = words.enumerate().fold(0u64, |acc, (i, w)| {
        acc | (u64::from_le_bytes(w.try_into().expect("8 bytes")) ^ word(key, i))
    });
    let last = word(key, usize::MAX).to_le_bytes();
    diff == 0 && rest == &last[..rest.len()]
}

/// The real CPU work a miss costs besides writing its value (a query, a decode): `units`
/// rounds of SipHash over a 1 KiB block, each seeded by the last, as the scenario's miss-cost
/// axis. Returns the last hash, so that the work is done.
pub(crate) fn miss_work(key: u64, units: u64) -> u64 {
    use std::hash::Hasher;
    static BLOCK: [u8; 1024] = [0x5a; 1024];
    let mut h = key;
    for _ in 0..units {
        let mut s = std::collections::hash_map::DefaultHasher::new();
        s.write_u64(h);
        s.write(std::hint::black_box(&BLOCK));
        h = s.finish();
    }
    h
}

/// The units of [`miss_work`] that take `cost` on this machine: the fastest of 7 timings of
/// 2000 units (the least disturbed), so that every peer of one run does the same work.
pub(crate) fn work_units(cost: Duration) -> u64 {
    const UNITS: u64 = 2000;
    if cost.is_zero() {
        return 0;
    }
    let per_unit = (0..7)
        .map(|i| {
            let t = Instant::now();
            std::hint::black_box(miss_work(i, UNITS));
            t.elapsed().as_secs_f64() / UNITS as f64
        })
        .fold(f64::MAX, f64::min);
    (cost.as_secs_f64() / per_unit).round().max(1.0) as u64
}

/// The bytes of the values of keys `0..keys`.
pub(crate) fn values_bytes(keys: u64) -> u64 {
    (0..keys).map(|k| len_of(k) as u64).sum()
}

/// The length of key `key`'s value in the scenario: 4 KiB to 64 KiB, 34 KiB on average.
fn len_of(key: u64) -> usize {
    4096 + ((key as usize).wrapping_mul(7919) % (60 << 10)) / 64 * 64
}

/// A new `Arc<[u8]>` holding key `key`'s value (the peers' regeneration: written in place,
/// as vrange-cache's `insert_with` writes into its slab).
fn regenerate(key: u64, len: usize) -> Arc<[u8]> {
    let mut a: Arc<[MaybeUninit<u8>]> = Arc::new_uninit_slice(len);
    let s = Arc::get_mut(&mut a).expect("a new Arc is unique");
    // SAFETY: `s` is `len` bytes of this Arc's own allocation; zeroing initialises them all.
    unsafe { std::ptr::write_bytes(s.as_mut_ptr(), 0, len) };
    // SAFETY: every byte was initialised just above.
    let mut a = unsafe { a.assume_init() };
    fill(key, Arc::get_mut(&mut a).expect("still unique"));
    a
}

fn minor_faults() -> u64 {
    procfs::page_faults().0
}

// ---------------------------------------------------------------------------------------
// The caches, behind one interface.

/// Byte weights for quick_cache.
#[derive(Clone, Copy)]
struct Bytes;

impl quick_cache::Weighter<u64, Arc<[u8]>> for Bytes {
    fn weight(&self, _: &u64, v: &Arc<[u8]>) -> u64 {
        v.len() as u64
    }
}

type Quick = quick_cache::sync::Cache<u64, Arc<[u8]>, Bytes>;

fn quick(capacity: u64, mean_len: u64) -> Quick {
    Quick::with_weighter(
        (capacity / mean_len.max(1)).max(16) as usize,
        capacity,
        Bytes,
    )
}

/// What a lookup found.
enum Found<'a> {
    Hit(&'a [u8]),
    Absent,
    Purged,
}

/// A cache of `u64` keys and byte values as the benchmark uses it.
trait Store: Sync {
    /// Inserts a copy of `value`; false if the cache refused it.
    fn insert(&self, key: u64, value: &[u8]) -> bool;
    /// Inserts key `key`'s value of `len` bytes, regenerated.
    fn regenerate(&self, key: u64, len: usize) -> bool;
    /// Looks `key` up and hands what it found to `with` (the handle dropped after).
    fn with<R>(&self, key: u64, with: impl FnOnce(Found) -> R) -> R;
    /// Finishes deferred work (moka's pending tasks), so that the cache holds what was
    /// inserted.
    fn settle(&self) {}
    /// Bytes the cache holds by its own account.
    fn bytes(&self) -> u64;
}

struct Vr(Cache<u64>);

impl Store for Vr {
    fn insert(&self, key: u64, value: &[u8]) -> bool {
        self.0.insert(key, value, Priority::Normal).is_ok()
    }

    fn regenerate(&self, key: u64, len: usize) -> bool {
        self.0
            .insert_with(key, len, Priority::Normal, |b| fill(key, b))
            .is_ok()
    }

    #[inline]
    fn with<R>(&self, key: u64, with: impl FnOnce(Found) -> R) -> R {
        match self.0.lookup(&key) {
            Ok(e) => with(Found::Hit(&e[..])),
            Err(Miss::Absent) => with(Found::Absent),
            Err(Miss::Purged) => with(Found::Purged),
        }
    }

    fn bytes(&self) -> u64 {
        self.0.stats().resident_bytes()
    }
}

/// A peer: a map of `u64` keys to shared values (`Arc<[u8]>`), as a Rust service holds them
/// without vrange. Every peer is the same [`Store`].
trait Peer: Sync {
    fn put(&self, key: u64, value: Arc<[u8]>);
    /// The value's handle, a clone of its `Arc`: read outside any lock of the peer's.
    fn get(&self, key: u64) -> Option<Arc<[u8]>>;
    /// Finishes deferred work (moka's pending tasks).
    fn settle(&self) {}
    /// Bytes of values the peer holds by its own account.
    fn bytes(&self) -> u64;
}

impl<P: Peer> Store for P {
    fn insert(&self, key: u64, value: &[u8]) -> bool {
        self.put(key, Arc::from(value));
        true
    }

    fn regenerate(&self, key: u64, len: usize) -> bool {
        self.put(key, regenerate(key, len));
        true
    }

    #[inline]
    fn with<R>(&self, key: u64, with: impl FnOnce(Found) -> R) -> R {
        match self.get(key) {
            Some(v) => with(Found::Hit(&v[..])),
            None => with(Found::Absent),
        }
    }

    fn settle(&self) {
        Peer::settle(self);
    }

    fn bytes(&self) -> u64 {
        Peer::bytes(self)
    }
}

type Moka = moka::sync::Cache<u64, Arc<[u8]>>;

impl Peer for Moka {
    fn put(&self, key: u64, value: Arc<[u8]>) {
        self.insert(key, value);
    }

    #[inline]
    fn get(&self, key: u64) -> Option<Arc<[u8]>> {
        Moka::get(self, &key)
    }

    fn settle(&self) {
        self.run_pending_tasks();
    }

    fn bytes(&self) -> u64 {
        self.weighted_size()
    }
}

impl Peer for Quick {
    fn put(&self, key: u64, value: Arc<[u8]>) {
        self.insert(key, value);
    }

    #[inline]
    fn get(&self, key: u64) -> Option<Arc<[u8]>> {
        Quick::get(self, &key)
    }

    fn bytes(&self) -> u64 {
        self.weight()
    }
}

type Lru = Mutex<lru::LruCache<u64, Arc<[u8]>>>;

impl Peer for Lru {
    fn put(&self, key: u64, value: Arc<[u8]>) {
        self.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .put(key, value);
    }

    #[inline]
    fn get(&self, key: u64) -> Option<Arc<[u8]>> {
        self.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
            .cloned()
    }

    fn bytes(&self) -> u64 {
        let c = self.lock().unwrap_or_else(PoisonError::into_inner);
        c.iter().map(|(_, v)| v.len() as u64).sum()
    }
}

/// `vrange-bench role cache ...`.
pub fn role(args: &[String]) -> i32 {
    match args.first().map(String::as_str) {
        Some("hot") => hot_role(&args[1..]),
        Some("service") => service_role(&args[1..]),
        _ => {
            eprintln!("usage: vrange-bench role cache hot|service ARGS");
            2
        }
    }
}

/// With `--trace FILE`, the hit ratio on that trace; else the hot path, the scenario and the
/// hit ratio on the synthetic trace (or the `--parts` asked for).
pub fn run(ctx: &Ctx) -> Result<(), String> {
    let part = |name: &str| {
        ctx.args
            .parts
            .as_ref()
            .is_none_or(|parts| parts.iter().any(|p| p == name))
    };
    if ctx.args.trace.is_none() {
        if part("hot") {
            hot_path(ctx)?;
        }
        if part("scenario") {
            scenario(ctx)?;
        }
    }
    if part("trace") || ctx.args.trace.is_some() {
        trace::hit_ratio(ctx)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_check_and_differ_by_key() {
        for len in [1, 7, 8, 1000, 4096] {
            let mut v = vec![0u8; len];
            fill(3, &mut v);
            assert!(check(3, len, &v));
            assert!(!check(4, len, &v) || len < 8);
            assert!(!check(3, len + 1, &v));
            assert!(check(3, len, &regenerate(3, len)));
        }
        assert!((4096..=65536).contains(&len_of(12345)));
    }
}
