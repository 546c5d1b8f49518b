//! Victims: the ranges the reclaimer may purge, collected from the registry and sorted by the
//! one victim order (`crate::order`), and the two loops that purge and arm them.

use crate::managed;
use crate::order::Place;
use crate::registry::{self, Priority};
use crate::short::{pressure_share, Event};
use crate::stats::Source;
use std::sync::atomic::Ordering::Relaxed;
use vrange_sys::clock::now_ns;

/// A range the reclaimer may purge, as seen in one pass over the registry: a private range
/// (its snapshot `word`), or a run of a shared region's volatile pages last used at the same
/// moment (`ino` the region's file, `page` its first page).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub priority: Priority,
    pub last_used: u64,
    pub idx: u32,
    pub word: u64,
    pub len: usize,
    pub page: usize,
    /// 0 for a private range.
    pub ino: u64,
}

impl Candidate {
    /// Its place in the victim order at `now` (`crate::order`).
    pub(crate) fn place(&self, now: u64) -> Place {
        Place::new(self.priority as u8, now.saturating_sub(self.last_used))
    }
}

/// Orders victims by the one victim order (`crate::order`); ties by slot and page, so the
/// order is total.
pub(crate) fn order(c: &mut [Candidate]) {
    let now = now_ns();
    c.sort_unstable_by_key(|c| (c.place(now), c.idx, c.page));
}

/// How many bytes a pressure signal asks to purge, given the resident volatile bytes now
/// (`crate::short`); 0 for the sources whose callers compute it (deficit, excess, request).
pub(crate) fn amount(source: Source, volatile: u64, share_percent: u64) -> u64 {
    let event = match source {
        Source::VmpressureCritical => Event::Critical,
        Source::Psi | Source::PsiCgroup | Source::VmpressureMedium => Event::Stall,
        Source::Headroom | Source::Budget | Source::Explicit => return 0,
    };
    pressure_share(event, volatile, share_percent)
}

fn collect(out: &mut Vec<Candidate>) {
    out.clear();
    // Room for every slot there is now and a run per page of the shared regions mapped,
    // allocated before the purge lock is taken (see [`candidates`]); a range created during
    // the scan is the youngest and waits for the next.
    out.reserve(registry::slots() + managed::shared_pages());
    let page = crate::page_size();
    // A shared region's pages live in its mapping, which freeing unmaps under the purge lock
    // (see `registry::Slot::header`).
    let _p = registry::pause();
    registry::for_each_live(|idx, slot| {
        if let Some(h) = slot.header() {
            let ino = slot.shared_ino();
            h.volatile_runs(|first, n, used| {
                if out.len() < out.capacity() {
                    out.push(Candidate {
                        priority: slot.priority(),
                        last_used: used,
                        idx,
                        word: 0,
                        len: n * page,
                        page: first,
                        ino,
                    });
                }
            });
            return;
        }
        let word = slot.state().load();
        if managed::purgeable(slot, word) && out.len() < out.capacity() {
            out.push(Candidate {
                priority: slot.priority(),
                last_used: slot.last_used(),
                idx,
                word,
                len: slot.len.load(Relaxed),
                page: 0,
                ino: 0,
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
        let slot = registry::slot(c.idx);
        let purged = if c.ino != 0 {
            let pages = c.len / crate::page_size();
            managed::purge_shared(slot, c.page, pages, Some(c.last_used))
        } else {
            managed::purge(c.idx, slot, c.word)
        };
        if let Some(n) = purged {
            ranges += 1;
            bytes += n as u64;
        }
    }
    (ranges, bytes)
}

/// What the reserve has and may take: the volatile hybrid ranges not armed yet and not hot
/// (marked again within `approach::HOT` and not idle that long since), in the victim order;
/// the bytes armed; and the armed ranges the kernel emptied, to settle.
pub(crate) struct Reserve {
    candidates: Vec<Candidate>,
    armed_bytes: u64,
    emptied: Vec<Candidate>,
}

/// The reserve's ranges now. The armed bytes are as recorded, or, with `verify` (the kernel
/// discarded lazily freed pages since the last look: a recorded count would keep counting
/// what it took), the armed pages still resident, one mincore(2) per armed range. Collected
/// outside the purge lock, as [`candidates`] (a range freed meanwhile counts nothing: mincore
/// of a hole fails).
pub(crate) fn reserve(now: u64, verify: bool) -> Reserve {
    let hot_ns = crate::approach::HOT.as_nanos() as u64;
    let mut r = Reserve {
        candidates: Vec::with_capacity(registry::slots()),
        armed_bytes: 0,
        emptied: Vec::new(),
    };
    registry::for_each_live(|idx, slot| {
        let word = slot.state().load();
        let candidate = |len| Candidate {
            priority: slot.priority(),
            last_used: slot.last_used(),
            idx,
            word,
            len,
            page: 0,
            ino: 0,
        };
        let recorded = managed::armed_bytes(slot, word);
        if recorded > 0 {
            let armed = if verify {
                managed::armed_resident(slot, word)
            } else {
                recorded
            };
            if armed == 0 {
                r.emptied.push(candidate(recorded));
            }
            r.armed_bytes = r.armed_bytes.saturating_add(armed as u64);
        }
        let delay = if slot.hot.load(Relaxed) { hot_ns } else { 0 };
        if managed::due_for_arming(slot, word, now, delay)
            && r.candidates.len() < r.candidates.capacity()
        {
            r.candidates.push(candidate(slot.len.load(Relaxed)));
        }
    });
    order(&mut r.candidates);
    r
}

/// Keeps `target` bytes armed: settles the armed ranges the kernel emptied (purged: their
/// content is gone already, and the next count skips them), then arms candidates in order
/// until what is armed reaches `target`. Returns (bytes armed now, bytes still missing). The
/// caller holds the purge lock. Does not allocate.
pub(crate) fn keep_reserve(r: &Reserve, target: u64) -> (u64, u64) {
    for c in &r.emptied {
        managed::settle(c.idx, registry::slot(c.idx), c.word);
    }
    let mut now_armed = 0u64;
    for c in &r.candidates {
        if r.armed_bytes.saturating_add(now_armed) >= target {
            break;
        }
        now_armed += managed::arm(registry::slot(c.idx), c.word) as u64;
    }
    (
        now_armed,
        target.saturating_sub(r.armed_bytes.saturating_add(now_armed)),
    )
}

/// Hands every hybrid range volatile for at least `delay_ns` to the kernel path (a hot range:
/// at least `approach::HOT`): away from the limit, what has been volatile for the arm delay.
/// Returns bytes armed.
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

    fn c(priority: Priority, last_used: u64, idx: u32) -> Candidate {
        Candidate {
            priority,
            last_used,
            idx,
            word: 0,
            len: 4096,
            page: 0,
            ino: 0,
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
        assert_eq!(amount(Source::Headroom, v, 25), 0);
    }
}
