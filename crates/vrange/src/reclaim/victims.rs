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
    /// Slot `idx`'s private range, seen in state `word`, of `len` bytes.
    fn private(idx: u32, slot: &registry::Slot, word: u64, len: usize) -> Candidate {
        Candidate {
            priority: slot.priority(),
            last_used: slot.last_used(),
            idx,
            word,
            len,
            page: 0,
            ino: 0,
        }
    }

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
            out.push(Candidate::private(idx, slot, word, slot.len.load(Relaxed)));
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

/// What is armed now: the armed bytes, and the armed ranges the kernel emptied, to settle.
#[derive(Default)]
pub(crate) struct Armed {
    pub bytes: u64,
    emptied: Vec<Candidate>,
}

/// What is armed now, one pass over the registry. The armed bytes are as recorded, or, with
/// `verify` (the kernel discarded lazily freed pages since the last look: a recorded count
/// would keep counting what it took), the armed pages still resident, one mincore(2) per armed
/// range. Outside the purge lock, as [`candidates`] (a range freed meanwhile counts nothing:
/// mincore of a hole fails). Allocates only for ranges found emptied.
pub(crate) fn armed(verify: bool) -> Armed {
    let mut a = Armed::default();
    registry::for_each_live(|idx, slot| {
        let word = slot.state().load();
        let recorded = managed::armed_bytes(slot, word);
        if recorded == 0 {
            return;
        }
        let bytes = if verify {
            managed::armed_resident(slot, word)
        } else {
            recorded
        };
        if bytes == 0 {
            a.emptied
                .push(Candidate::private(idx, slot, word, recorded));
        }
        a.bytes = a.bytes.saturating_add(bytes as u64);
    });
    a
}

/// The reserve's candidates, into `out` (the reclaimer's, kept from tick to tick, so that a
/// scan allocates only when the registry has grown): the volatile hybrid ranges not armed yet
/// and not hot (marked again within `approach::HOT` and not idle that long since), the coldest
/// first in the victim order as far as they cover `need` bytes (the rest follow in no order).
/// Outside the purge lock, as [`candidates`].
///
/// Ordering only the prefix a tick arms keeps a tick in proportion to what it arms: SQLite's
/// page cache holds tens of thousands of one-page ranges, and sorting them all at every tight
/// tick (10 ms) took a tenth of a CPU.
pub(crate) fn reserve_candidates(now: u64, need: u64, out: &mut Vec<Candidate>) {
    let hot_ns = crate::approach::HOT.as_nanos() as u64;
    out.clear();
    out.reserve(registry::slots());
    registry::for_each_live(|idx, slot| {
        let word = slot.state().load();
        let delay = if slot.hot.load(Relaxed) { hot_ns } else { 0 };
        if managed::due_for_arming(slot, word, now, delay) && out.len() < out.capacity() {
            out.push(Candidate::private(idx, slot, word, slot.len.load(Relaxed)));
        }
    });
    order_coldest(out, need);
}

/// Puts the coldest candidates first in the victim order ([`order`]), as many as cover `need`
/// bytes (all of them if they do not): a selection, then a sort of that prefix only.
fn order_coldest(c: &mut [Candidate], need: u64) {
    let now = now_ns();
    let key = |c: &Candidate| (c.place(now), c.idx, c.page);
    let total: u64 = c.iter().map(|c| c.len as u64).sum();
    if c.len() < 2 || total <= need {
        c.sort_unstable_by_key(key);
        return;
    }
    // Ranges are near one size where there are many (pages, slabs): the first guess at how
    // many cover `need` nearly always does; when it does not, the rest are sorted too.
    let k = usize::try_from(need / (total / c.len() as u64).max(1))
        .unwrap_or(usize::MAX)
        .min(c.len() - 1);
    c.select_nth_unstable_by_key(k, key);
    let (head, tail) = c.split_at_mut(k + 1);
    head.sort_unstable_by_key(key);
    if head.iter().map(|c| c.len as u64).sum::<u64>() < need {
        tail.sort_unstable_by_key(key);
    }
}

/// Keeps `target` bytes armed: settles the armed ranges the kernel emptied (`armed`: their
/// content is gone already, and the next count skips them), then arms `candidates` in order
/// until what is armed reaches `target`. Returns (bytes armed now, bytes still missing). The
/// caller holds the purge lock. Does not allocate.
pub(crate) fn keep_reserve(armed: &Armed, candidates: &[Candidate], target: u64) -> (u64, u64) {
    for c in &armed.emptied {
        managed::settle(c.idx, registry::slot(c.idx), c.word);
    }
    let mut now_armed = 0u64;
    for c in candidates {
        if armed.bytes.saturating_add(now_armed) >= target {
            break;
        }
        now_armed += managed::arm(registry::slot(c.idx), c.word) as u64;
    }
    (
        now_armed,
        target.saturating_sub(armed.bytes.saturating_add(now_armed)),
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

    /// The prefix `order_coldest` sorts is the full order's prefix covering `need`, for sizes
    /// alike and unlike (the first guess short of `need`).
    #[test]
    fn the_coldest_prefix_is_the_full_orders() {
        let classes = [Priority::DropFirst, Priority::Low, Priority::Normal];
        let mut v: Vec<Candidate> = (0..200u32)
            .map(|i| {
                let mut x = c(classes[(i * 7 % 3) as usize], u64::from(i * 37 % 101), i);
                x.len = if i % 10 == 0 { 64 << 10 } else { 4096 };
                x
            })
            .collect();
        let mut full = v.clone();
        order(&mut full);
        for need in [0, 4096, 100 << 10, 1 << 20, u64::MAX] {
            order_coldest(&mut v, need);
            let mut covered = 0u64;
            for (got, want) in v.iter().zip(&full) {
                assert_eq!(got.idx, want.idx, "need {need}");
                covered += got.len as u64;
                if covered >= need {
                    break;
                }
            }
        }
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
