//! The last reading of how memory stands, for a caller that may not lock or open files (a fill
//! in a SIGBUS handler): atomics only, below every module that fills or reclaims.
//!
//! Every `reclaim::room` call, and the reclaimer thread at each tick while refill regions
//! filled on the faulting thread live, [`publish`] what they read; refill fills count what they
//! charge and give back ([`charged`]). [`recent`] is that reading less what fills charged since.
//! It knows nothing of what others charged since (other threads' allocations, other processes
//! of the cgroup): the reclaimer's next reading, and its purges, see to that. A reading older
//! than [`STALE_TICKS`] of the reclaimer's ticks (and a second) is not used: without the
//! reclaimer (`VRANGE_RECLAIMER=off`) such fills never count memory as short, and the kernel's
//! reclaim takes their lazily freed blocks instead.

use crate::short::Room;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use vrange_sys::clock::now_ns;

/// The last reading. Its fields may come from two readings when one is published while
/// [`recent`] reads it: each is a reading's, and a fill's choice rests on it only until the
/// next.
struct Seen {
    headroom: AtomicU64,
    free: AtomicU64,
    threshold: AtomicU64,
    /// [`CHARGED`] when it was read.
    charged: AtomicU64,
    /// Until when it is used (ns, `now_ns`); 0: never read.
    until: AtomicU64,
}

static SEEN: Seen = Seen {
    headroom: AtomicU64::new(0),
    free: AtomicU64::new(0),
    threshold: AtomicU64::new(0),
    charged: AtomicU64::new(0),
    until: AtomicU64::new(0),
};

/// Bytes refill fills charged to the cgroup less those they gave back, since the start
/// (wrapping: only differences are read).
static CHARGED: AtomicU64 = AtomicU64::new(0);

/// Readings older than this many of the reclaimer's ticks (and than a second) are not used.
pub(crate) const STALE_TICKS: u64 = 3;

/// A refill fill charged `bytes` to the memory cgroup (negative: gave them back).
/// Async-signal-safe.
pub(crate) fn charged(bytes: i64) {
    CHARGED.fetch_add(bytes as u64, Relaxed);
}

/// What fills have charged so far: read before a reading, so that what they charge from
/// there on is counted against it.
pub(crate) fn charged_so_far() -> u64 {
    CHARGED.load(Relaxed)
}

/// Publishes `room`, read when fills had charged `charged` ([`charged_so_far`]), to be used
/// until `until` (ns, `now_ns`).
pub(crate) fn publish(room: &Room, charged: u64, until: u64) {
    SEEN.headroom.store(room.headroom, Relaxed);
    SEEN.free.store(room.free, Relaxed);
    SEEN.threshold.store(room.threshold, Relaxed);
    SEEN.charged.store(charged, Relaxed);
    SEEN.until.store(until, Relaxed);
}

/// How memory stands, from the last reading less what fills charged since; `None` without a
/// recent reading. Async-signal-safe: atomics and the clock.
pub(crate) fn recent() -> Option<Room> {
    if now_ns() > SEEN.until.load(Relaxed) {
        return None;
    }
    let since = CHARGED
        .load(Relaxed)
        .wrapping_sub(SEEN.charged.load(Relaxed)) as i64;
    Some(Room {
        headroom: SEEN.headroom.load(Relaxed).saturating_add_signed(-since),
        threshold: SEEN.threshold.load(Relaxed),
        free: SEEN.free.load(Relaxed).saturating_add_signed(-since),
    })
}
