//! The state machine of one managed range: a single atomic word that every mark, unmark, arm
//! and purge changes with compare-and-swap. The mark and unmark paths never lock and never make
//! a system call; they only wait (spin, then yield) while another thread is in the middle of a
//! transition that must not be observed half done.
//!
//! This file must not depend on anything but `crate::sync`: the loom model in
//! `tests/loom_state.rs` compiles it on its own against loom's atomics.
//!
//! # States and transitions
//!
//! | state      | mark                           | unmark                                   | reclaimer                                   |
//! |------------|--------------------------------|------------------------------------------|---------------------------------------------|
//! | `PINNED`   | last pin: → `VOLATILE`, gen+1; else pins−1 | no-op (`join`: pins+1)          | skips                                       |
//! | `VOLATILE` | no-op                          | → `PINNED`: intact                       | `begin_arm` → `ARMING`; `begin_purge` → `PURGING` |
//! | `ARMING`   | no-op                          | sets `CANCEL`, waits for `ARMED`         | (arming thread) `finish_arm` → `ARMED`      |
//! | `ARMED`    | no-op                          | → `BUSY`; the caller proves each armed page with its witness, then `finish_unmark` → `PINNED` | `begin_purge` → `PURGING` |
//! | `PURGING`  | no-op                          | waits for `PURGED`                        | (purging thread) `finish_purge` → `PURGED`, or `abort_purge` → the word it began from (nothing was discarded) |
//! | `PURGED`   | no-op (the purge is kept for the next unmark) | → `PINNED`: purged          | skips                                       |
//! | `BUSY`     | waits                          | waits                                    | skips                                       |
//!
//! `claim` moves any settled state to `BUSY` for an owner that needs the range to itself (to
//! split it, or to move its ends); `release` ends the claim with the word to leave behind, and
//! `release_volatile` with a volatile word of a new generation.
//!
//! The word also carries a pin count (how many processes hold a shared range pinned; 1 for a
//! private pinned range) and a generation that every mark increments. The reclaimer chooses
//! victims from a snapshot and succeeds only if the word still equals it: a range used and made
//! volatile again in between has a newer generation (and a newer age) and is not purged on stale
//! information.
//!
//! # Guarantees
//! - An unmark that reports a managed range intact returned after moving it out of `VOLATILE`,
//!   so no purge can start on it afterwards; a purge already started is waited for.
//! - An unmark never returns while a purge or an arming step of the same range is half done.

use crate::sync::atomic::{AtomicU64, Ordering};
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
const PINS_SHIFT: u32 = 8;
const PINS_MASK: u64 = 0xFFFF << PINS_SHIFT;
const GEN_SHIFT: u32 = 24;
const GEN_ONE: u64 = 1 << GEN_SHIFT;
const GEN_MASK: u64 = !0 << GEN_SHIFT;

/// The state tag of a word.
pub fn tag(word: u64) -> u64 {
    word & TAG_MASK
}

/// How many holders pin the range (meaningful in `PINNED`).
pub fn pins(word: u64) -> u64 {
    (word & PINS_MASK) >> PINS_SHIFT
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

fn pinned(word: u64, pins: u64) -> u64 {
    with_tag(word, PINNED) | (pins << PINS_SHIFT)
}

/// What a mark did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marked {
    /// The range became volatile (from the word returned).
    Now,
    /// It was volatile (or being purged, or purged) already.
    Already,
    /// A shared range still pinned by other holders: one pin was dropped.
    StillPinned,
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

/// What a transition decides from the word it sees (see `RangeState::transition`).
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

/// The atomic state word of one range.
#[derive(Debug)]
#[repr(transparent)]
pub struct RangeState(AtomicU64);

impl RangeState {
    /// A new range, pinned by one holder.
    #[cfg_attr(not(test), allow(dead_code))] // ranges live in zeroed slots; tests and loom use it
    pub fn new_pinned() -> RangeState {
        RangeState(AtomicU64::new(pinned(0, 1)))
    }

    /// Resets a recycled word to pinned by one holder. Only for a range nobody else can see.
    /// The generation keeps growing, so a snapshot taken before recycling never matches again.
    pub fn reset(&self) {
        let old = self.0.load(Ordering::Relaxed);
        self.0
            .store(pinned(old.wrapping_add(GEN_ONE), 1), Ordering::Release);
    }

    /// Sets a recycled word to the tag and pins of `word` (a range split off another), with a
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

    /// Applies `decide` to the current word until its compare-and-swap lands. `Wait` backs off
    /// and looks again; `Cancel` asks an arming thread to stop early and then waits for it.
    fn transition<T>(&self, decide: impl Fn(u64) -> Step<T>) -> T {
        let mut round = 0;
        loop {
            let word = self.0.load(Ordering::Acquire);
            let (next, result) = match decide(word) {
                Step::Done(result) => return result,
                Step::To(next, result) => (next, result),
                Step::Wait => {
                    backoff(&mut round);
                    continue;
                }
                Step::Cancel => {
                    let _ = self.0.compare_exchange(
                        word,
                        word | CANCEL,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    );
                    continue;
                }
            };
            if self
                .0
                .compare_exchange(word, next, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                return result;
            }
        }
    }

    /// Drops one pin; the last makes the range volatile with a new generation.
    pub fn mark(&self) -> Marked {
        self.transition(|word| match tag(word) {
            PINNED if pins(word) > 1 => Step::To(pinned(word, pins(word) - 1), Marked::StillPinned),
            PINNED => Step::To(with_tag(word.wrapping_add(GEN_ONE), VOLATILE), Marked::Now),
            BUSY => Step::Wait,
            _ => Step::Done(Marked::Already),
        })
    }

    /// Pins the range. `join` adds a holder to an already pinned range (a second process of a
    /// shared range); without it unmarking a pinned range does nothing.
    pub fn unmark(&self, join: bool) -> Found {
        self.transition(|word| match tag(word) {
            PINNED if !join => Step::Done(Found::Pinned),
            PINNED => Step::To(pinned(word, pins(word) + 1), Found::Pinned),
            VOLATILE => Step::To(pinned(word, 1), Found::Intact),
            PURGED => Step::To(pinned(word, 1), Found::Purged),
            ARMED => Step::To(with_tag(word, BUSY), Found::Armed),
            ARMING if word & CANCEL == 0 => Step::Cancel,
            // ARMING with CANCEL set, PURGING, BUSY: another thread finishes first.
            _ => Step::Wait,
        })
    }

    /// Ends an unmark that found the range [`Found::Armed`]: pinned by one holder.
    pub fn finish_unmark(&self) {
        let word = self.0.load(Ordering::Relaxed);
        debug_assert_eq!(tag(word), BUSY);
        self.0.store(pinned(word, 1), Ordering::Release);
    }

    /// Claims a settled range for its owner (→ `BUSY`), waiting out purges and cancelling an
    /// arming. Returns the word it replaced, to be restored (or changed) by [`RangeState::release`].
    pub fn claim(&self) -> u64 {
        self.transition(|word| match tag(word) {
            PINNED | VOLATILE | ARMED | PURGED => {
                Step::To(with_tag(word, BUSY) | (word & PINS_MASK), word)
            }
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

    /// Gives up a purge begun by this thread from `seen`, whose content was not discarded (the
    /// kernel refused): the range is as it was, and no one learns of the attempt.
    pub fn abort_purge(&self, seen: u64) {
        debug_assert_eq!(tag(self.0.load(Ordering::Relaxed)), PURGING);
        self.0.store(seen, Ordering::Release);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_cycle() {
        let s = RangeState::new_pinned();
        assert_eq!(s.unmark(false), Found::Pinned);
        assert_eq!(s.mark(), Marked::Now);
        assert_eq!(s.mark(), Marked::Already);
        assert_eq!(s.unmark(false), Found::Intact);
        assert_eq!(s.mark(), Marked::Now);
        assert_eq!(generation(s.load()), 2);
        let seen = s.load();
        assert!(s.begin_purge(seen));
        assert!(!s.begin_purge(seen));
        s.finish_purge();
        assert_eq!(s.mark(), Marked::Already);
        assert_eq!(s.unmark(false), Found::Purged);
        assert_eq!(s.unmark(false), Found::Pinned);
    }

    #[test]
    fn stale_snapshot_cannot_purge() {
        let s = RangeState::new_pinned();
        s.mark();
        let seen = s.load();
        s.unmark(false);
        s.mark();
        assert!(
            !s.begin_purge(seen),
            "a range used in between must not be purged"
        );
        assert!(!s.begin_arm(seen));
    }

    #[test]
    fn shared_pins_count() {
        let s = RangeState::new_pinned();
        assert_eq!(s.unmark(true), Found::Pinned);
        assert_eq!(pins(s.load()), 2);
        assert_eq!(s.mark(), Marked::StillPinned);
        assert!(!s.begin_purge(s.load()));
        assert_eq!(s.mark(), Marked::Now);
        assert!(s.begin_purge(s.load()));
        s.finish_purge();
        assert_eq!(s.unmark(true), Found::Purged);
        assert_eq!(pins(s.load()), 1);
    }

    #[test]
    fn arm_then_unmark_and_claim() {
        let s = RangeState::new_pinned();
        s.mark();
        assert!(s.begin_arm(s.load()));
        assert!(!s.arm_cancelled());
        s.finish_arm();
        assert_eq!(tag(s.load()), ARMED);
        assert_eq!(s.unmark(false), Found::Armed);
        assert_eq!(tag(s.load()), BUSY);
        s.finish_unmark();
        assert_eq!(s.load() & TAG_MASK, PINNED);
        let before = s.claim();
        assert_eq!(tag(s.load()), BUSY);
        s.release(before);
        assert_eq!(s.load(), before);
    }
}
