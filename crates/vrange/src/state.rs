//! The state machines of managed memory: one atomic word per private range, and one per page
//! of a shared region, that every mark, unmark, arm and purge changes with compare-and-swap.
//! The mark and unmark paths never lock and never make a system call; they only wait (spin,
//! then yield) while another thread is in the middle of a transition that must not be observed
//! half done.
//!
//! This file must not depend on anything but `crate::sync`: the loom model in
//! `tests/loom_state.rs` compiles it on its own against loom's atomics.
//!
//! # A private range ([`RangeState`])
//!
//! | state      | mark                           | unmark                                   | reclaimer                                   |
//! |------------|--------------------------------|------------------------------------------|---------------------------------------------|
//! | `PINNED`   | → `VOLATILE`, gen+1            | no-op                                    | skips                                       |
//! | `VOLATILE` | no-op                          | → `PINNED`: intact                       | `begin_arm` → `ARMING`; `begin_purge` → `PURGING` |
//! | `ARMING`   | no-op                          | sets `CANCEL`, waits for `ARMED`         | (arming thread) `finish_arm` → `ARMED`      |
//! | `ARMED`    | no-op                          | → `BUSY`; the caller proves each armed page with its witness, then `finish_unmark` → `PINNED` | `begin_purge` → `PURGING` |
//! | `PURGING`  | no-op                          | waits for `PURGED`                        | (purging thread) `finish_purge` → `PURGED` |
//! | `PURGED`   | no-op (the purge is kept for the next unmark) | → `PINNED`: purged          | skips                                       |
//! | `BUSY`     | waits                          | waits                                    | skips                                       |
//!
//! `claim` moves any settled state to `BUSY` for an owner that needs the range to itself (to
//! split it, or to move its ends); `release` ends the claim with the word to leave behind, and
//! `release_volatile` with a volatile word of a new generation.
//!
//! The word also carries a generation that every mark increments. The reclaimer chooses
//! victims from a snapshot and succeeds only if the word still equals it: a range used and made
//! volatile again in between has a newer generation (and a newer age) and is not purged on stale
//! information.
//!
//! # A page of a shared region ([`SharedPage`])
//!
//! Every process mapping a shared region is a *holder* (one of [`HOLDERS`], numbered in the
//! region's header); the page's word carries the set of holders pinning it, and a second word
//! the holders that have not seen its last purge (*lost*). A purge bumps no per-process epoch:
//! it sets every lost bit while the page is `PURGING`, and each holder clears its own at its
//! next pin, which reports the purge even if another holder pinned and refilled the page first.
//!
//! | state                 | pin (holder h)                                  | unpin (holder h)                                   | purger |
//! |-----------------------|-------------------------------------------------|----------------------------------------------------|--------|
//! | `PINNED`, holders H   | h ∈ H: held already; else H ∪ {h}: intact, or purged if h's lost bit was set | h ∈ H: H − {h}; the last → `VOLATILE`, gen+1, its last use stamped first | skips |
//! | `VOLATILE`            | → `PINNED` {h}: intact, or purged if h's lost bit was set | not held: no-op                     | `begin_purge` → `PURGING` |
//! | `PURGING`             | waits                                           | not held: no-op                                    | (purging thread) `finish_purge`: every lost bit set, → `PURGED`; or `abort_purge` → `VOLATILE` as it was |
//! | `PURGED`              | → `PINNED` {h}: purged                          | not held: no-op                                    | skips |
//!
//! A dead holder's pins are released by another process calling `unpin` for it, page by page
//! (the holder cannot race: it is dead); [`SharedPage::forget`] clears a holder's lost bit when
//! its number is given up or taken by a new mapping.
//!
//! # Guarantees
//! - An unmark that reports a managed range (or a shared page) intact returned after moving it
//!   out of `VOLATILE`, so no purge can start on it afterwards; a purge already started is
//!   waited for.
//! - An unmark never returns while a purge or an arming step of the same range is half done.
//! - A shared page is purged only while no holder pins it, and every holder that unpinned it
//!   before the purge learns of it at its next pin.

use crate::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use crate::sync::backoff;

const TAG_MASK: u64 = 0xF;
/// In use: the reclaimer never touches it.
pub const PINNED: u64 = 0;
/// Unused and resident; the reclaimer may purge it.
pub const VOLATILE: u64 = 1;
/// Being handed to the kernel's lazy-free path, a block at a time.
pub const ARMING: u64 = 2;
/// Handed to the kernel (MADV_FREE over the first `armed` bytes); the kernel may drop pages.
pub const ARMED: u64 = 3;
/// The reclaimer is discarding the range.
pub const PURGING: u64 = 4;
/// Discarded: content reads as zero; the next unmark reports it.
pub const PURGED: u64 = 5;
/// Claimed by its owner for a multi-step change.
pub const BUSY: u64 = 6;

/// Set on an `ARMING` word by an unmark that wants the arming thread to stop early.
const CANCEL: u64 = 1 << 4;
const GEN_SHIFT: u32 = 24;
const GEN_ONE: u64 = 1 << GEN_SHIFT;
const GEN_MASK: u64 = !0 << GEN_SHIFT;

/// The state tag of a word.
pub fn tag(word: u64) -> u64 {
    word & TAG_MASK
}

/// The generation of a word (increments at every mark).
#[cfg_attr(not(test), allow(dead_code))] // for tests and the loom model
pub fn generation(word: u64) -> u64 {
    word >> GEN_SHIFT
}

/// Whether the reclaimer may start a purge from a word in this state.
pub fn is_purgeable(word: u64) -> bool {
    matches!(tag(word), VOLATILE | ARMED)
}

fn with_tag(word: u64, tag: u64) -> u64 {
    (word & GEN_MASK) | tag
}

fn pinned(word: u64) -> u64 {
    with_tag(word, PINNED)
}

/// What a mark did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marked {
    /// The range became volatile (from the word returned).
    Now,
    /// It was volatile (or being purged, or purged) already.
    Already,
}

/// What an unmark found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// Not volatile: nothing to report.
    Pinned,
    /// Volatile and resident: intact, now pinned.
    Intact,
    /// Purged whole: now pinned, content zero.
    Purged,
    /// Armed: the range is now `BUSY` for the caller, who must check the armed pages with their
    /// witnesses and then call [`RangeState::finish_unmark`].
    Armed,
}

/// What a transition decides from the word it sees (see [`transition`]).
enum Step<T> {
    /// Swap in this word, then return the result.
    To(u64, T),
    /// Nothing to change: return the result.
    Done(T),
    /// Another thread is mid-transition: back off and look again.
    Wait,
    /// An arming is under way: ask it to stop, then wait for it.
    Cancel,
}

/// Applies `decide` to the current value of `word` until its compare-and-swap lands. `Wait`
/// backs off and looks again; `Cancel` asks an arming thread to stop early and then waits for
/// it.
fn transition<T>(word: &AtomicU64, decide: impl Fn(u64) -> Step<T>) -> T {
    let mut round = 0;
    loop {
        let seen = word.load(Ordering::Acquire);
        let (next, result) = match decide(seen) {
            Step::Done(result) => return result,
            Step::To(next, result) => (next, result),
            Step::Wait => {
                backoff(&mut round);
                continue;
            }
            Step::Cancel => {
                let _ =
                    word.compare_exchange(seen, seen | CANCEL, Ordering::AcqRel, Ordering::Acquire);
                continue;
            }
        };
        if word
            .compare_exchange(seen, next, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            return result;
        }
    }
}

/// The atomic state word of one range.
#[derive(Debug)]
#[repr(transparent)]
pub struct RangeState(AtomicU64);

impl RangeState {
    /// A new range, pinned.
    #[cfg_attr(not(test), allow(dead_code))] // ranges live in zeroed slots; tests and loom use it
    pub fn new_pinned() -> RangeState {
        RangeState(AtomicU64::new(pinned(0)))
    }

    /// Resets a recycled word to pinned. Only for a range nobody else can see. The generation
    /// keeps growing, so a snapshot taken before recycling never matches again.
    pub fn reset(&self) {
        let old = self.0.load(Ordering::Relaxed);
        self.0
            .store(pinned(old.wrapping_add(GEN_ONE)), Ordering::Release);
    }

    /// Sets a recycled word to the tag of `word` (a range split off another), with a
    /// generation newer than both.
    pub fn reset_to(&self, word: u64) {
        let old = self.0.load(Ordering::Relaxed);
        let generation = (old & GEN_MASK).max(word & GEN_MASK).wrapping_add(GEN_ONE);
        self.0
            .store(generation | (word & !GEN_MASK), Ordering::Release);
    }

    /// The current word, for the reclaimer's snapshot.
    pub fn load(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// Makes a pinned range volatile with a new generation.
    pub fn mark(&self) -> Marked {
        transition(&self.0, |word| match tag(word) {
            PINNED => Step::To(with_tag(word.wrapping_add(GEN_ONE), VOLATILE), Marked::Now),
            BUSY => Step::Wait,
            _ => Step::Done(Marked::Already),
        })
    }

    /// Pins the range; unmarking a pinned range does nothing.
    pub fn unmark(&self) -> Found {
        transition(&self.0, |word| match tag(word) {
            PINNED => Step::Done(Found::Pinned),
            VOLATILE => Step::To(pinned(word), Found::Intact),
            PURGED => Step::To(pinned(word), Found::Purged),
            ARMED => Step::To(with_tag(word, BUSY), Found::Armed),
            ARMING if word & CANCEL == 0 => Step::Cancel,
            // ARMING with CANCEL set, PURGING, BUSY: another thread finishes first.
            _ => Step::Wait,
        })
    }

    /// Ends an unmark that found the range [`Found::Armed`]: pinned.
    pub fn finish_unmark(&self) {
        let word = self.0.load(Ordering::Relaxed);
        debug_assert_eq!(tag(word), BUSY);
        self.0.store(pinned(word), Ordering::Release);
    }

    /// Claims a settled range for its owner (→ `BUSY`), waiting out purges and cancelling an
    /// arming. Returns the word it replaced, to be restored (or changed) by [`RangeState::release`].
    pub fn claim(&self) -> u64 {
        transition(&self.0, |word| match tag(word) {
            PINNED | VOLATILE | ARMED | PURGED => Step::To(with_tag(word, BUSY), word),
            ARMING if word & CANCEL == 0 => Step::Cancel,
            _ => Step::Wait,
        })
    }

    /// Ends a claim, leaving `word` (typically the one [`RangeState::claim`] returned).
    pub fn release(&self, word: u64) {
        debug_assert_eq!(tag(self.0.load(Ordering::Relaxed)), BUSY);
        self.0.store(word, Ordering::Release);
    }

    /// Ends a claim by making the range volatile with a new generation (its owner changed its
    /// extent and gives all of it up).
    pub fn release_volatile(&self) {
        let word = self.0.load(Ordering::Relaxed);
        debug_assert_eq!(tag(word), BUSY);
        self.0.store(
            with_tag(word.wrapping_add(GEN_ONE), VOLATILE),
            Ordering::Release,
        );
    }

    /// Starts a purge if the range is still exactly as the reclaimer saw it.
    pub fn begin_purge(&self, seen: u64) -> bool {
        is_purgeable(seen)
            && self
                .0
                .compare_exchange(
                    seen,
                    with_tag(seen, PURGING),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// Ends a purge begun by this thread: the range is `PURGED`.
    pub fn finish_purge(&self) {
        let word = self.0.load(Ordering::Relaxed);
        debug_assert_eq!(tag(word), PURGING);
        self.0.store(with_tag(word, PURGED), Ordering::Release);
    }

    /// Starts arming a range that is still exactly as the reclaimer saw it (volatile).
    pub fn begin_arm(&self, seen: u64) -> bool {
        tag(seen) == VOLATILE
            && self
                .0
                .compare_exchange(
                    seen,
                    with_tag(seen, ARMING),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// Whether an unmark asked the arming thread to stop.
    pub fn arm_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire) & CANCEL != 0
    }

    /// Ends an arming begun by this thread: the range is `ARMED` (over however many bytes the
    /// caller recorded before calling this).
    pub fn finish_arm(&self) {
        // Only CANCEL can change under us while ARMING; storing ARMED also clears it.
        let word = self.0.load(Ordering::Relaxed);
        debug_assert_eq!(tag(word), ARMING);
        self.0.store(with_tag(word, ARMED), Ordering::Release);
    }
}

// ---- Shared pages ----

/// Holders a shared region has at most: the bits of a page's holder set.
pub const HOLDERS: usize = 32;
const HOLDERS_SHIFT: u32 = 4;
const HOLDERS_MASK: u64 = (u32::MAX as u64) << HOLDERS_SHIFT;
const PAGE_GEN_SHIFT: u32 = HOLDERS_SHIFT + HOLDERS as u32;
const PAGE_GEN_ONE: u64 = 1 << PAGE_GEN_SHIFT;
const PAGE_GEN_MASK: u64 = !0 << PAGE_GEN_SHIFT;
/// Every holder's lost bit.
const ALL_LOST: u32 = u32::MAX;

fn holder_bit(h: u32) -> u64 {
    debug_assert!((h as usize) < HOLDERS);
    1 << (HOLDERS_SHIFT + h)
}

/// The holders pinning a shared page, as a bit set (bit h: holder h).
#[cfg_attr(not(test), allow(dead_code))] // for tests and the loom model
pub fn holders(word: u64) -> u32 {
    ((word & HOLDERS_MASK) >> HOLDERS_SHIFT) as u32
}

/// The generation of a shared page's word (increments whenever it becomes volatile).
#[cfg_attr(not(test), allow(dead_code))] // for tests and the loom model
pub fn page_generation(word: u64) -> u64 {
    word >> PAGE_GEN_SHIFT
}

/// The word of a shared page in `tag` with no holder, keeping the generation of `word`.
fn page_word(word: u64, tag: u64) -> u64 {
    (word & PAGE_GEN_MASK) | tag
}

/// What a pin of a shared page found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PagePin {
    /// The holder pinned it already: nothing changed.
    Held,
    /// Pinned now; its content is what the holder left (or another holder wrote since).
    Intact,
    /// Pinned now; it was purged since the holder last held it: its content is lost.
    Purged,
}

/// What an unpin of a shared page did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageUnpin {
    /// The holder did not pin it: nothing changed.
    NotHeld,
    /// Another holder still pins it.
    StillPinned,
    /// It became volatile: no holder pins it any more.
    Now,
}

/// One page of a shared region, in the region's file (see the module documentation): its
/// word (tag, holders, generation), when it last became volatile (CLOCK_MONOTONIC ns, the age
/// purgers order it by) and the holders that have not seen its last purge. A file of zeros is
/// a table of pages pinned by no holder: [`SharedPage::init`] each before use.
#[derive(Debug)]
#[repr(C)]
pub struct SharedPage {
    word: AtomicU64,
    used: AtomicU64,
    lost: AtomicU32,
}

impl SharedPage {
    /// A page pinned by holder `h`, never purged.
    #[cfg_attr(not(test), allow(dead_code))] // pages live in the region's file; tests and loom use it
    pub fn new_pinned(h: u32) -> SharedPage {
        SharedPage {
            word: AtomicU64::new(PINNED | holder_bit(h)),
            used: AtomicU64::new(0),
            lost: AtomicU32::new(0),
        }
    }

    /// Makes a page of a region nobody else maps yet pinned by holder `h`, never purged.
    pub fn init(&self, h: u32) {
        self.used.store(0, Ordering::Relaxed);
        self.lost.store(0, Ordering::Relaxed);
        self.word.store(PINNED | holder_bit(h), Ordering::Release);
    }

    /// The current word, for a purger's look.
    pub fn load(&self) -> u64 {
        self.word.load(Ordering::Acquire)
    }

    /// When the page last became volatile (meaningful while it is).
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Relaxed)
    }

    /// Whether holder `h` pins the page.
    pub fn is_held_by(&self, h: u32) -> bool {
        self.load() & holder_bit(h) != 0
    }

    /// Pins the page for holder `h`, waiting out a purge under way.
    pub fn pin(&self, h: u32) -> PagePin {
        let bit = holder_bit(h);
        let found = transition(&self.word, |word| match tag(word) {
            PINNED if word & bit != 0 => Step::Done(PagePin::Held),
            PINNED => Step::To(word | bit, PagePin::Intact),
            VOLATILE => Step::To(page_word(word, PINNED) | bit, PagePin::Intact),
            PURGED => Step::To(page_word(word, PINNED) | bit, PagePin::Purged),
            // PURGING: the purging thread finishes first.
            _ => Step::Wait,
        });
        if found == PagePin::Held {
            return found;
        }
        // A purge since h last held the page set h's lost bit before its word left PURGING;
        // the swap above, on a word written after that, acquired it.
        let lost = self.lost.fetch_and(!(1 << h), Ordering::AcqRel) & (1 << h) != 0;
        if lost {
            PagePin::Purged
        } else {
            found
        }
    }

    /// Drops holder `h`'s pin (for a live holder, or for a dead one by whoever releases its
    /// pins), stamping `now` as the page's last use first: if it was the last pin, the page is
    /// volatile from `now`, with a new generation.
    pub fn unpin(&self, h: u32, now: u64) -> PageUnpin {
        let bit = holder_bit(h);
        // Only h itself sets its bit: a page h does not pin stays so while this runs.
        if self.word.load(Ordering::Relaxed) & bit == 0 {
            return PageUnpin::NotHeld;
        }
        // Before the word can become volatile: a purger that sees the volatile word sees this
        // stamp (or a later one) and orders the page by it.
        self.used.store(now, Ordering::Relaxed);
        transition(&self.word, |word| {
            if word & bit == 0 {
                Step::Done(PageUnpin::NotHeld)
            } else if word & HOLDERS_MASK == bit {
                Step::To(
                    page_word(word.wrapping_add(PAGE_GEN_ONE), VOLATILE),
                    PageUnpin::Now,
                )
            } else {
                Step::To(word & !bit, PageUnpin::StillPinned)
            }
        })
    }

    /// Clears holder `h`'s lost bit: its number is given up, or taken by a new mapping, which
    /// has lost nothing yet.
    pub fn forget(&self, h: u32) {
        self.lost.fetch_and(!(1 << h), Ordering::AcqRel);
    }

    /// Starts a purge if the page is still exactly as the purger saw it, volatile.
    pub fn begin_purge(&self, seen: u64) -> bool {
        tag(seen) == VOLATILE
            && self
                .word
                .compare_exchange(
                    seen,
                    page_word(seen, PURGING),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// Gives up a purge begun by this thread, whose content was not discarded: the page is
    /// volatile again, exactly as the purge found it (no holder, the same generation).
    pub fn abort_purge(&self) {
        let word = self.word.load(Ordering::Relaxed);
        debug_assert_eq!(tag(word), PURGING);
        self.word
            .store(page_word(word, VOLATILE), Ordering::Release);
    }

    /// Ends a purge begun by this thread: every holder has lost the page, and it is `PURGED`.
    pub fn finish_purge(&self) {
        self.lost.store(ALL_LOST, Ordering::Release);
        let word = self.word.load(Ordering::Relaxed);
        debug_assert_eq!(tag(word), PURGING);
        self.word.store(page_word(word, PURGED), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_cycle() {
        let s = RangeState::new_pinned();
        assert_eq!(s.unmark(), Found::Pinned);
        assert_eq!(s.mark(), Marked::Now);
        assert_eq!(s.mark(), Marked::Already);
        assert_eq!(s.unmark(), Found::Intact);
        assert_eq!(s.mark(), Marked::Now);
        assert_eq!(generation(s.load()), 2);
        let seen = s.load();
        assert!(s.begin_purge(seen));
        assert!(!s.begin_purge(seen));
        s.finish_purge();
        assert_eq!(s.mark(), Marked::Already);
        assert_eq!(s.unmark(), Found::Purged);
        assert_eq!(s.unmark(), Found::Pinned);
    }

    #[test]
    fn stale_snapshot_cannot_purge() {
        let s = RangeState::new_pinned();
        s.mark();
        let seen = s.load();
        s.unmark();
        s.mark();
        assert!(
            !s.begin_purge(seen),
            "a range used in between must not be purged"
        );
        assert!(!s.begin_arm(seen));
    }

    #[test]
    fn shared_page_holders_and_lost_bits() {
        let p = SharedPage::new_pinned(0);
        assert_eq!(p.pin(0), PagePin::Held);
        assert_eq!(p.pin(3), PagePin::Intact);
        assert_eq!(holders(p.load()), 0b1001);
        assert_eq!(p.unpin(0, 5), PageUnpin::StillPinned);
        assert_eq!(p.unpin(0, 6), PageUnpin::NotHeld);
        assert!(!p.begin_purge(p.load()), "holder 3 pins it");
        assert_eq!(p.unpin(3, 7), PageUnpin::Now);
        assert_eq!((p.used(), page_generation(p.load())), (7, 1));
        let seen = p.load();
        assert!(p.begin_purge(seen));
        p.finish_purge();
        assert!(!p.begin_purge(p.load()), "purged already");
        // Holder 3 pins first and refills; holder 0 still learns of the purge.
        assert_eq!(p.pin(3), PagePin::Purged);
        assert_eq!(p.pin(0), PagePin::Purged);
        assert_eq!(p.pin(0), PagePin::Held);
        // A new holder in a freed number has lost nothing.
        p.forget(5);
        assert_eq!(p.pin(5), PagePin::Intact);
        // A purge that failed leaves the page volatile and nobody's lost bit set.
        for h in [0, 3, 5] {
            p.unpin(h, 9);
        }
        let seen = p.load();
        assert!(p.begin_purge(seen));
        p.abort_purge();
        assert_eq!(p.load(), seen);
        assert_eq!(p.pin(0), PagePin::Intact);
    }

    #[test]
    fn stale_page_snapshot_cannot_purge() {
        let p = SharedPage::new_pinned(1);
        p.unpin(1, 1);
        let seen = p.load();
        p.pin(2);
        p.unpin(2, 2);
        assert!(
            !p.begin_purge(seen),
            "a page used in between must not be purged"
        );
        assert_eq!(tag(p.load()), VOLATILE);
    }

    #[test]
    fn arm_then_unmark_and_claim() {
        let s = RangeState::new_pinned();
        s.mark();
        assert!(s.begin_arm(s.load()));
        assert!(!s.arm_cancelled());
        s.finish_arm();
        assert_eq!(tag(s.load()), ARMED);
        assert_eq!(s.unmark(), Found::Armed);
        assert_eq!(tag(s.load()), BUSY);
        s.finish_unmark();
        assert_eq!(s.load() & TAG_MASK, PINNED);
        let before = s.claim();
        assert_eq!(tag(s.load()), BUSY);
        s.release(before);
        assert_eq!(s.load(), before);
    }
}
