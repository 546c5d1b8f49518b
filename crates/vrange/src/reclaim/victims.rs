//! Victims: the ranges the reclaimer may purge, collected from the registry and sorted by the
//! one victim order (`crate::order`), and the two loops that purge and arm them.

use crate::managed;
use crate::order::Place;
use crate::registry::{self, Priority};
use crate::short::{pressure_share, Event};
use crate::stats::Source;
use std::sync::atomic::Ordering::{Acquire, Relaxed};
use vrange_sys::clock::now_ns;
use vrange_sys::mem;

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

impl Armed {
    /// Counts `c`, an armed range of which `resident` bytes are still resident.
    fn count(&mut self, c: Candidate, resident: usize) {
        if resident == 0 {
            self.emptied.push(c);
        }
        self.bytes = self.bytes.saturating_add(resident as u64);
    }
}

/// The reserve's buffers, kept by the reclaimer from tick to tick (no allocation once grown):
/// the candidates to arm, and the armed ranges seen by [`armed`].
#[derive(Default)]
pub(crate) struct Scratch {
    pub candidates: Vec<Candidate>,
    seen: Vec<Seen>,
}

/// An armed range seen by [`armed`]: its start and its region's, so that the armed ranges of
/// one region are counted with one mincore(2).
#[derive(Debug, Clone, Copy)]
struct Seen {
    start: usize,
    region: usize,
    /// `len`: the bytes recorded armed.
    c: Candidate,
}

/// What is armed now, one pass over the registry. The armed bytes are as recorded, or, with
/// `verify` (the kernel discarded lazily freed pages since the last look: a recorded count
/// would keep counting what it took), the armed pages still resident: one mincore(2) per run
/// of armed ranges of one region (up to `mem::RESIDENCY_PAGES` pages), not one per range,
/// since SQLite's page cache arms thousands of one-page ranges and a call for each made a
/// tight tick take 15 ms, which the reserve then counted as reaction time and grew by. Outside
/// the purge lock, as [`candidates`] (a range freed meanwhile counts nothing: mincore of a
/// hole fails). Allocates only to grow `scratch` and for ranges found emptied.
pub(crate) fn armed(verify: bool, scratch: &mut Scratch) -> Armed {
    let mut a = Armed::default();
    let seen = &mut scratch.seen;
    seen.clear();
    if verify {
        seen.reserve(registry::slots());
    }
    registry::for_each_live(|idx, slot| {
        let word = slot.state().load();
        let recorded = managed::armed_bytes(slot, word);
        if recorded == 0 {
            return;
        }
        let c = Candidate::private(idx, slot, word, recorded);
        if !verify {
            a.bytes = a.bytes.saturating_add(recorded as u64);
        } else if seen.len() < seen.capacity() {
            let start = slot.start.load(Acquire);
            let region = slot.region_start.load(Relaxed);
            seen.push(Seen { start, region, c });
        } else {
            // More armed ranges than the registry had slots when the scan began: one call.
            a.count(c, managed::armed_resident(slot, word));
        }
    });
    seen.sort_unstable_by_key(|s| s.start);
    count_runs(seen, &mut a, |s| {
        managed::armed_resident(registry::slot(s.c.idx), s.c.word)
    });
    a
}

/// Counts the armed ranges `seen` (sorted by start) into `a`: one mincore(2) per run of ranges
/// of one region that fits [`mem::RESIDENCY_PAGES`] pages; `alone` counts a range by itself
/// where its run's call failed (a range freed meanwhile: a hole) or it is longer than that.
fn count_runs(seen: &[Seen], a: &mut Armed, alone: impl Fn(&Seen) -> usize) {
    let mut pages = [0u8; mem::RESIDENCY_PAGES];
    let page = mem::page_size();
    let mut rest = seen;
    while let Some(first) = rest.first() {
        let fits = |s: &&Seen| {
            s.region == first.region
                && (s.start - first.start)
                    .saturating_add(s.c.len)
                    .div_ceil(page)
                    <= pages.len()
        };
        let (run, after) = rest.split_at(rest.iter().take_while(fits).count().max(1));
        rest = after;
        let last = run[run.len() - 1];
        let len = (last.start - first.start).saturating_add(last.c.len);
        let whole = mem::residency(first.start as *mut u8, len, &mut pages).is_ok();
        for s in run {
            let resident = if whole {
                let at = (s.start - first.start) / page;
                let bits = &pages[at..at + s.c.len.div_ceil(page)];
                bits.iter().filter(|b| **b & 1 != 0).count() * page
            } else {
                alone(s)
            };
            a.count(s.c, resident);
        }
    }
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
/// until what is armed reaches `target`, or until `until` (ns; checked between ranges).
/// Returns (bytes armed now, bytes still missing). The caller holds the purge lock. Does not
/// allocate.
///
/// The deadline keeps a tick short: arming thousands of one-page ranges (SQLite's page cache)
/// is one madvise(2) and one TLB shootdown each, and took a tick 20–55 ms; the reserve counts
/// the time between ticks as time a neighbour can charge in, so a long tick grew the next
/// reserve, which made the next tick longer still. What is not armed by then is the deficit:
/// the next marks arm their own ranges, and the next tick (`approach::TIGHT_POLL` later) goes
/// on.
pub(crate) fn keep_reserve(
    armed: &Armed,
    candidates: &[Candidate],
    target: u64,
    until: u64,
) -> (u64, u64) {
    for c in &armed.emptied {
        managed::settle(c.idx, registry::slot(c.idx), c.word);
    }
    let mut now_armed = 0u64;
    for c in candidates {
        if armed.bytes.saturating_add(now_armed) >= target || now_ns() >= until {
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

    /// Armed ranges are counted by runs of one region, one mincore(2) each: exactly the
    /// resident pages of each range; a range longer than one call covers, and one freed
    /// meanwhile (a hole), are counted alone, and an emptied range is listed to settle.
    #[test]
    fn armed_ranges_are_counted_by_runs_of_a_region() {
        let page = mem::page_size();
        let map = |pages: usize| {
            let p = mem::map_anon(pages * page, page).expect("map").as_ptr();
            mem::populate_write(p, pages * page).expect("populate");
            p
        };
        let gone = |p: *mut u8| {
            // SAFETY: one page of a mapping of this test, which nothing reads afterwards.
            unsafe { mem::purge_forced(p, page) }.expect("purge");
        };
        let seen_at = |start: *mut u8, region: *mut u8, pages: usize, idx: u32| Seen {
            start: start as usize,
            region: region as usize,
            c: Candidate {
                len: pages * page,
                ..c(Priority::Normal, 0, idx)
            },
        };
        // A region of 128 pages with a one-page range at every even page: pages 2, 10 and 40
        // (ranges 1, 5 and 20) gone.
        let a = map(128);
        for p in [2, 10, 40] {
            gone(a.wrapping_add(p * page));
        }
        // A range longer than one call covers, its first page gone.
        let long = mem::RESIDENCY_PAGES + 1;
        let b = map(long);
        gone(b);
        // A region freed before the count: an address nothing maps, below the kernel's
        // mmap_min_addr (a mapping freed here could be taken by another test's thread before
        // the count, as the 6.1 guest's CI run found).
        let c4 = page as *mut u8;
        let mut seen: Vec<Seen> = (0..64u32)
            .map(|i| seen_at(a.wrapping_add(2 * i as usize * page), a, 1, i))
            .collect();
        seen.push(seen_at(b, b, long, 100));
        seen.push(seen_at(c4, c4, 4, 101));
        seen.sort_unstable_by_key(|s| s.start);
        let alone = std::cell::Cell::new(0);
        let mut armed = Armed::default();
        count_runs(&seen, &mut armed, |s| {
            alone.set(alone.get() + 1);
            mem::resident_pages(s.start as *mut u8, s.c.len).map_or(0, |n| n * page)
        });
        assert_eq!(armed.bytes, ((64 - 3) + (long - 1)) as u64 * page as u64);
        let mut emptied: Vec<u32> = armed.emptied.iter().map(|c| c.idx).collect();
        emptied.sort_unstable();
        assert_eq!(emptied, [1, 5, 20, 101]);
        assert_eq!(alone.get(), 2, "the long range and the hole, each alone");
        for (p, pages) in [(a, 128), (b, long)] {
            // SAFETY: this test's mappings, not used again.
            unsafe { mem::unmap(std::ptr::NonNull::new(p).expect("mapped"), pages * page) };
        }
    }

    /// Past its deadline a tick arms nothing more: what is missing is left to the marks and
    /// the next tick (the candidates are not touched: they name no live range here).
    #[test]
    fn past_the_deadline_nothing_more_is_armed() {
        let armed = Armed {
            bytes: 10,
            emptied: Vec::new(),
        };
        let never_touched = [c(Priority::Normal, 0, u32::MAX)];
        assert_eq!(keep_reserve(&armed, &never_touched, 100, 0), (0, 90));
        assert_eq!(keep_reserve(&armed, &never_touched, 10, u64::MAX), (0, 0));
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
