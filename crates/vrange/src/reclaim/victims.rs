//! Victim choice and how much to purge: pure functions of a snapshot (tested with made-up
//! candidates), and the two loops that apply them to the registry.

use crate::managed;
use crate::registry::{self, Priority};
use crate::stats::Source;
use std::sync::atomic::Ordering::Relaxed;

/// A range the reclaimer may purge, as seen in one pass over the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub priority: Priority,
    pub last_used: u64,
    pub idx: u32,
    pub word: u64,
    pub len: usize,
}

/// Orders victims: lowest class first, then least recently used.
pub(crate) fn order(c: &mut [Candidate]) {
    c.sort_unstable_by_key(|c| (c.priority, c.last_used, c.idx));
}

/// How many bytes a signal asks to purge, given the resident volatile bytes now.
pub(crate) fn amount(source: Source, volatile: u64, share_percent: u64) -> u64 {
    const MIN_PURGE: u64 = 2 << 20;
    match source {
        Source::VmpressureCritical => volatile,
        Source::Psi | Source::PsiCgroup | Source::VmpressureMedium => {
            (volatile * share_percent / 100).max(MIN_PURGE)
        }
        // The callers of these compute the amount themselves (deficit, excess, request).
        Source::Headroom | Source::Budget | Source::Explicit => 0,
    }
}

/// Whether the machine as a whole is short of memory, so that a stall on the system's PSI file
/// should purge: MemAvailable below a tenth of MemTotal (earlyoom's default line). The system
/// file counts stalls of every cgroup, one thrashing at its own limit too; purging here does
/// not relieve that cgroup, and while the machine has memory available it is not this
/// process's to give back (its own cgroup's pressure comes from vmpressure, headroom and v2's
/// `memory.pressure`). Unknown (no MemAvailable, or /proc unreadable): short, as before.
pub(crate) fn system_short(meminfo: Option<(u64, u64)>) -> bool {
    match meminfo {
        Some((total_kb, avail_kb)) => avail_kb < total_kb / 10,
        None => true,
    }
}

/// Bytes to purge so that headroom (limit minus usage) returns to twice the threshold: none
/// while it is at least the threshold. The one rule for every purger of headroom (each
/// process's reclaimer, [`make_room`](crate::reclaimer::make_room), the coordinator).
pub fn headroom_deficit(headroom: u64, threshold: u64) -> u64 {
    if headroom >= threshold {
        0
    } else {
        threshold.saturating_mul(2) - headroom
    }
}

/// The headroom threshold for a limit (the cgroup's `memory.max`, or `memory.high` where
/// lower) under `VRANGE_HEADROOM=auto`: a sixteenth of it, between 4 and 256 MiB.
pub fn auto_headroom(limit: u64) -> u64 {
    (limit / 16).clamp(4 << 20, 256 << 20)
}

/// The threshold a `VRANGE_HEADROOM` setting (bytes, or `auto`) gives for a limit.
pub(super) fn threshold(setting: u64, limit: u64) -> u64 {
    if setting == super::config::HEADROOM_AUTO {
        auto_headroom(limit)
    } else {
        setting
    }
}

fn collect(out: &mut Vec<Candidate>) {
    out.clear();
    // Room for every slot there is now, allocated before the purge lock is taken (see
    // [`candidates`]); a range created during the scan is the youngest and waits for the next.
    out.reserve(registry::slots());
    // A shared range's word and last use live in its region's mapping, which freeing unmaps
    // under the purge lock (see `registry::Slot::header`).
    let _p = registry::pause();
    registry::for_each_live(|idx, slot| {
        let word = slot.state().load();
        if managed::purgeable(slot, word) && out.len() < out.capacity() {
            out.push(Candidate {
                priority: slot.priority(),
                last_used: slot.last_used(),
                idx,
                word,
                len: slot.len.load(std::sync::atomic::Ordering::Relaxed),
            });
        }
    });
}

/// The ranges the reclaimer may purge now, in purge order. Collected before purging starts and
/// outside the purge lock: this allocates, and an allocator built on vrange may take its own
/// locks in that allocation (the snapshot words keep stale entries from being purged).
pub(crate) fn candidates() -> Vec<Candidate> {
    let mut victims = Vec::new();
    collect(&mut victims);
    order(&mut victims);
    victims
}

/// Purges whole ranges of `victims` (from [`candidates`]) in order until at least `target`
/// bytes are freed or none is left. Returns (ranges, bytes). Does not allocate.
pub(crate) fn purge_oldest(victims: &[Candidate], target: u64) -> (u64, u64) {
    let (mut ranges, mut bytes) = (0, 0);
    for c in victims {
        if bytes >= target {
            break;
        }
        if let Some(n) = managed::purge(c.idx, registry::slot(c.idx), c.word) {
            ranges += 1;
            bytes += n as u64;
        }
    }
    (ranges, bytes)
}

/// Hands every hybrid range volatile for at least `delay_ns` to the kernel path (a hot range:
/// at least `approach::HOT`). Returns bytes armed.
pub(crate) fn arm_due(now: u64, delay_ns: u64) -> u64 {
    let hot_ns = crate::approach::HOT.as_nanos() as u64;
    let mut armed = 0;
    registry::for_each_live(|_, slot| {
        let word = slot.state().load();
        let delay_ns = if slot.hot.load(Relaxed) {
            delay_ns.max(hot_ns)
        } else {
            delay_ns
        };
        if managed::due_for_arming(slot, word, now, delay_ns) {
            armed += managed::arm(slot, word) as u64;
        }
    });
    armed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deficits_and_thresholds() {
        assert_eq!(headroom_deficit(10, 8), 0);
        assert_eq!(headroom_deficit(3, 8), 13);
        assert_eq!(auto_headroom(128 << 20), 8 << 20);
        assert_eq!(auto_headroom(1 << 20), 4 << 20);
        assert_eq!(auto_headroom(64 << 30), 256 << 20);
        assert_eq!(
            threshold(super::super::config::HEADROOM_AUTO, 128 << 20),
            8 << 20
        );
        assert_eq!(threshold(5 << 20, 128 << 20), 5 << 20);
    }

    fn c(priority: Priority, last_used: u64, idx: u32) -> Candidate {
        Candidate {
            priority,
            last_used,
            idx,
            word: 0,
            len: 4096,
        }
    }

    #[test]
    fn class_first_then_least_recently_used() {
        let mut v = vec![
            c(Priority::Normal, 5, 1),
            c(Priority::DropLast, 1, 2),
            c(Priority::DropFirst, 9, 3),
            c(Priority::Normal, 2, 4),
            c(Priority::Low, 7, 5),
        ];
        order(&mut v);
        let idx: Vec<u32> = v.iter().map(|c| c.idx).collect();
        assert_eq!(idx, [3, 5, 4, 1, 2]);
    }

    #[test]
    fn amounts() {
        let v = 100 << 20;
        assert_eq!(amount(Source::VmpressureCritical, v, 25), v);
        assert_eq!(amount(Source::VmpressureMedium, v, 25), 25 << 20);
        assert_eq!(amount(Source::Psi, 1 << 20, 25), 2 << 20);
        assert_eq!(headroom_deficit(10, 8), 0);
        assert_eq!(headroom_deficit(3, 8), 13);
        assert_eq!(auto_headroom(128 << 20), 8 << 20);
        assert_eq!(auto_headroom(16 << 20), 4 << 20);
        assert_eq!(auto_headroom(1 << 40), 256 << 20);
    }

    #[test]
    fn system_psi_purges_only_when_the_machine_is_short() {
        let total = 24 << 20; // KiB
        assert!(!system_short(Some((total, total / 2))));
        assert!(!system_short(Some((total, total / 10))));
        assert!(system_short(Some((total, total / 10 - 1))));
        assert!(system_short(Some((total, 0))));
        assert!(system_short(None));
    }
}
