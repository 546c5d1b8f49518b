//! Loom model check of the range state machine (`src/state.rs`).
//!
//! `state.rs` depends only on `crate::sync::{atomic, backoff}`, so it is compiled here a second
//! time against loom's atomics (the `sync` shim below) and the interleavings of a few small
//! scenarios are explored: all of them for the two-thread scenarios, and those with at most
//! [`THREE_THREAD_PREEMPTIONS`] preemptions for the three-thread ones, so the file stays quick.
//!
//! Page content that the owner and the reclaimer both touch is a `loom::cell::UnsafeCell`: loom
//! reports any access to it that is not ordered by happens-before, so the models check not only
//! the state tags but also that the state word's orderings hand the memory over correctly. Flags
//! that an invariant reads are loaded `Relaxed` for the same reason: only a happens-before edge
//! through the state word makes the value the assertion expects the one loom must return.
//!
//! `LOOM_MAX_PREEMPTIONS=N` bounds every scenario to N preemptions instead (with every side in a
//! thread of its own, see `loom_shim`: 3 takes some seconds, 4 a minute and a half on two
//! cores; exploring the three-thread scenarios exhaustively takes far longer).

// ci: host only: a model of the state machine, not of the kernel

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use loom::sync::Arc;
use loom::thread;

#[allow(dead_code)] // each model uses part of it
mod loom_shim;

use loom_shim::check;
pub(crate) use loom_shim::sync;

#[path = "../src/state.rs"]
#[allow(dead_code)]
mod state;

use state::{Found, Marked, PagePin, PageUnpin, RangeState, SharedPage};

/// Preemptions explored per execution of the scenarios with three threads, unless
/// `LOOM_MAX_PREEMPTIONS` says otherwise. The two-thread scenarios are explored exhaustively.
const THREE_THREAD_PREEMPTIONS: usize = 3;

/// What the owner wrote before marking the range volatile.
const CONTENT: u8 = 0xAA;

/// One page of a managed range: the owner reads and writes it while the range is pinned, the
/// reclaimer zeroes it while the range is `PURGING`.
struct Page(UnsafeCell<u8>);

impl Page {
    fn new() -> Page {
        Page(UnsafeCell::new(CONTENT))
    }

    fn read(&self) -> u8 {
        // SAFETY: loom checks that no write to the cell races with this read.
        self.0.with(|p| unsafe { *p })
    }

    fn write(&self, value: u8) {
        // SAFETY: loom checks that no other access to the cell races with this write.
        self.0.with_mut(|p| unsafe { *p = value })
    }
}

/// What the sides of scenario 1 share.
#[derive(Clone)]
struct Purging {
    s: Arc<RangeState>,
    page: Arc<Page>,
    discarded: Arc<AtomicBool>,
    finishing: Arc<AtomicBool>,
}

impl Purging {
    /// The reclaimer's side: purge from a snapshot if it may.
    fn purge(&self) -> bool {
        let seen = self.s.load();
        if state::is_purgeable(seen) && self.s.begin_purge(seen) {
            self.page.write(0);
            self.discarded.store(true, Ordering::Relaxed);
            self.finishing.store(true, Ordering::Relaxed);
            self.s.finish_purge();
            true
        } else {
            false
        }
    }

    /// The owner's side: use the page, mark, unmark, and check what the unmark found.
    fn use_and_unmark(&self) -> Found {
        self.page.write(CONTENT); // the owner's last use before marking
        assert_eq!(self.s.mark(), Marked::Now);
        let found = self.s.unmark();
        match found {
            Found::Intact => {
                assert!(
                    !self.discarded.load(Ordering::Relaxed),
                    "intact, but the page was discarded"
                );
                assert_eq!(self.page.read(), CONTENT);
                self.page.write(CONTENT + 1); // the owner uses the range again
            }
            Found::Purged => {
                assert!(
                    self.discarded.load(Ordering::Relaxed),
                    "purged, but the discard is not visible"
                );
                assert!(
                    self.finishing.load(Ordering::Relaxed),
                    "returned before finish_purge ran"
                );
                assert_eq!(self.page.read(), 0);
            }
            other => panic!("unmark of a marked range found {other:?}"),
        }
        assert_eq!(state::tag(self.s.load()), state::PINNED);
        found
    }
}

/// Scenario 1: the owner marks and unmarks while a reclaimer purges from its snapshot.
///
/// - The purge's discard never races with the owner's use of the page before the mark.
/// - `Intact`: no purge started before the unmark, none can after it, and the page is untouched.
/// - `Purged`: the whole purge (discard, then `finish_purge`) happened before the unmark
///   returned: the owner reads the zeroed page without a race and sees the purge's last step.
#[test]
fn mark_unmark_vs_purge() {
    check(None, || {
        let s = Arc::new(RangeState::new_pinned());
        let page = Arc::new(Page::new());
        let discarded = Arc::new(AtomicBool::new(false));
        let finishing = Arc::new(AtomicBool::new(false));
        let shared = Purging {
            s: s.clone(),
            page: page.clone(),
            discarded: discarded.clone(),
            finishing: finishing.clone(),
        };

        let reclaimer = {
            let p = shared.clone();
            thread::spawn(move || p.purge())
        };

        // The owner runs in a thread of its own, as the reclaimer does (see `loom_shim`).
        let owner = {
            let p = shared.clone();
            thread::spawn(move || p.use_and_unmark())
        };
        let found = owner.join().unwrap();

        let purged = reclaimer.join().unwrap();
        assert_eq!(purged, found == Found::Purged, "purge and report disagree");
        if found == Found::Intact {
            assert!(
                !discarded.load(Ordering::Relaxed),
                "discarded after an intact unmark"
            );
            assert_eq!(page.read(), CONTENT + 1);
        }
        assert_eq!(state::tag(s.load()), state::PINNED);
    });
}

const DIRTY: u8 = 0;
const LAZY: u8 = 1;
const DISCARDED: u8 = 2;
/// Pages of the hybrid range; the armer hands one to the kernel per step.
const ARM_PAGES: usize = 2;

/// What the sides of scenario 2 share.
#[derive(Clone)]
struct Arming {
    s: Arc<RangeState>,
    pages: Arc<[AtomicU8; ARM_PAGES]>,
    armed: Arc<AtomicUsize>,
    arming: Arc<AtomicBool>,
    unmarking: Arc<AtomicBool>,
}

/// Scenario 2: a hybrid range armed a page per step while its owner unmarks it (cancelling the
/// arming) and the kernel drops lazily-freed pages.
///
/// - An unmark never returns while an arming step is in progress.
/// - The armed count the owner reads covers every page the armer handed to the kernel, so every
///   page the kernel discarded is proved and reported purged; a page reported intact was not
///   discarded, and no page is left lazily freed after the unmark.
/// - Only an unmark sets the cancel flag.
#[test]
fn hybrid_arm_with_cancellation() {
    check(Some(THREE_THREAD_PREEMPTIONS), || {
        let s = Arc::new(RangeState::new_pinned());
        let a = Arming {
            s: s.clone(),
            pages: Arc::new([AtomicU8::new(DIRTY), AtomicU8::new(DIRTY)]),
            armed: Arc::new(AtomicUsize::new(0)),
            arming: Arc::new(AtomicBool::new(false)),
            unmarking: Arc::new(AtomicBool::new(false)),
        };
        let pages = a.pages.clone();

        assert_eq!(s.mark(), Marked::Now);

        let armer = {
            let Arming {
                s,
                pages,
                armed,
                arming,
                unmarking,
            } = a.clone();
            thread::spawn(move || {
                let seen = s.load();
                if !s.begin_arm(seen) {
                    return;
                }
                arming.store(true, Ordering::Relaxed);
                for (step, page) in pages.iter().enumerate() {
                    if s.arm_cancelled() {
                        assert!(unmarking.load(Ordering::Relaxed), "cancelled by nobody");
                        break;
                    }
                    page.store(LAZY, Ordering::SeqCst); // MADV_FREE
                    armed.store(step + 1, Ordering::Release);
                }
                arming.store(false, Ordering::Relaxed);
                s.finish_arm();
            })
        };

        let kernel = {
            let pages = pages.clone();
            thread::spawn(move || {
                let mut dropped = [false; ARM_PAGES];
                for (page, dropped) in pages.iter().zip(&mut dropped) {
                    *dropped = page
                        .compare_exchange(LAZY, DISCARDED, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok();
                }
                dropped
            })
        };

        let owner = {
            let Arming {
                s,
                pages,
                armed,
                arming,
                unmarking,
            } = a;
            thread::spawn(move || {
                unmarking.store(true, Ordering::Relaxed);
                let mut reported = [None; ARM_PAGES]; // Some(purged) for each proved page
                match s.unmark() {
                    Found::Intact => {
                        assert_eq!(armed.load(Ordering::Relaxed), 0, "intact, but armed");
                    }
                    Found::Armed => {
                        assert!(
                            !arming.load(Ordering::Relaxed),
                            "returned while an arming step was half done"
                        );
                        let n = armed.swap(0, Ordering::Relaxed);
                        // The witness: pin each armed page and learn whether the kernel dropped it.
                        for (page, report) in pages.iter().zip(&mut reported).take(n) {
                            *report = Some(match page.swap(DIRTY, Ordering::SeqCst) {
                                LAZY => false,
                                DISCARDED => true,
                                _ => {
                                    panic!("a page counted as armed was never handed to the kernel")
                                }
                            });
                        }
                        assert_eq!(state::tag(s.load()), state::BUSY);
                        s.finish_unmark();
                    }
                    other => panic!("unmark of a marked hybrid range found {other:?}"),
                }
                assert_eq!(state::tag(s.load()), state::PINNED);
                reported
            })
        };
        let reported = owner.join().unwrap();

        armer.join().unwrap();
        let dropped = kernel.join().unwrap();
        for i in 0..ARM_PAGES {
            match reported[i] {
                Some(purged) => assert_eq!(purged, dropped[i], "page {i} misreported"),
                None => assert!(!dropped[i], "page {i} was discarded but never proved"),
            }
            assert_eq!(
                pages[i].load(Ordering::SeqCst),
                DIRTY,
                "page {i} left lazily freed"
            );
        }
        assert_eq!(state::tag(s.load()), state::PINNED);
    });
}

/// Scenario 3: the owner claims a volatile range to split it while a reclaimer purges.
///
/// - `claim` never returns a word in the middle of a purge (or an arming): the word it returns
///   is settled, and the owner's work under the claim (changing the extent) never races with
///   the purge (which reads the extent and discards the page).
/// - After the release the word is the one claimed, unless the purge won: before the claim
///   (the claim returned the `PURGED` word and the purge saw the old extent) or after the
///   release (the purge saw the new extent).
#[test]
fn purge_racing_with_claim() {
    check(None, || {
        let s = Arc::new(RangeState::new_pinned());
        let page = Arc::new(Page::new());
        let extent = Arc::new(UnsafeCell::new(2usize));
        let purging = Arc::new(AtomicBool::new(false));

        assert_eq!(s.mark(), Marked::Now);
        let volatile = s.load();

        let reclaimer = {
            let (s, page, extent, purging) =
                (s.clone(), page.clone(), extent.clone(), purging.clone());
            thread::spawn(move || {
                let seen = s.load();
                if !(state::is_purgeable(seen) && s.begin_purge(seen)) {
                    return None;
                }
                purging.store(true, Ordering::Relaxed);
                // SAFETY: loom checks that no write to the extent races with this read.
                let len = extent.with(|p| unsafe { *p });
                page.write(0);
                purging.store(false, Ordering::Relaxed);
                s.finish_purge();
                Some(len)
            })
        };

        let owner = {
            let (s, extent, purging) = (s.clone(), extent.clone(), purging.clone());
            thread::spawn(move || {
                let claimed = s.claim();
                assert!(
                    !purging.load(Ordering::Relaxed),
                    "claim returned during a purge"
                );
                assert!(
                    matches!(state::tag(claimed), state::VOLATILE | state::PURGED),
                    "claimed an unsettled word {claimed:#x}"
                );
                assert_eq!(state::generation(claimed), state::generation(volatile));
                assert_eq!(state::tag(s.load()), state::BUSY);
                // SAFETY: loom checks that no other access to the extent races with this write.
                extent.with_mut(|p| unsafe { *p = 1 }); // split: this range keeps the head
                s.release(claimed);
                claimed
            })
        };
        let claimed = owner.join().unwrap();

        let purge = reclaimer.join().unwrap();
        let now = s.load();
        match purge {
            None => {
                assert_eq!(claimed, volatile);
                assert_eq!(now, claimed, "the release did not stick");
            }
            Some(2) => {
                assert_eq!(
                    state::tag(claimed),
                    state::PURGED,
                    "purged before the claim, claimed as {claimed:#x}"
                );
                assert_eq!(now, claimed);
            }
            Some(1) => {
                assert_eq!(
                    claimed, volatile,
                    "purged after the release, claimed as {claimed:#x}"
                );
                assert_eq!(state::tag(now), state::PURGED);
                assert_eq!(state::generation(now), state::generation(volatile));
            }
            Some(len) => panic!("purge saw extent {len}"),
        }
        assert_eq!(page.read(), if purge.is_some() { 0 } else { CONTENT });
    });
}

/// Scenario 4: a reclaimer holding a snapshot of the volatile range races with its owner using
/// the range and making it volatile again (a new generation). A purge from the old snapshot
/// succeeds only if it came before the owner's unmark, which then reports `Purged`; it never
/// lands on the new generation, whose unmark always reports `Intact`.
#[test]
fn stale_snapshot_cannot_purge() {
    check(None, || {
        let s = Arc::new(RangeState::new_pinned());
        let page = Arc::new(Page::new());

        assert_eq!(s.mark(), Marked::Now);
        let seen = s.load(); // taken while volatile, used later

        let reclaimer = {
            let (s, page) = (s.clone(), page.clone());
            thread::spawn(move || {
                if s.begin_purge(seen) {
                    page.write(0);
                    s.finish_purge();
                    true
                } else {
                    false
                }
            })
        };

        let owner = {
            let (s, page) = (s.clone(), page.clone());
            thread::spawn(move || {
                let first = s.unmark();
                let expect = match first {
                    Found::Intact => CONTENT,
                    Found::Purged => 0,
                    other => panic!("first unmark found {other:?}"),
                };
                assert_eq!(page.read(), expect);
                page.write(CONTENT + 1);
                assert_eq!(s.mark(), Marked::Now);
                let second = s.unmark();
                assert_eq!(
                    second,
                    Found::Intact,
                    "the new generation was purged from a stale snapshot"
                );
                assert_eq!(page.read(), CONTENT + 1);
                first
            })
        };
        let first = owner.join().unwrap();

        let purged = reclaimer.join().unwrap();
        assert_eq!(
            purged,
            first == Found::Purged,
            "stale purge: first unmark found {first:?}"
        );
        assert!(state::generation(s.load()) > state::generation(seen));
    });
}

/// A purger of a shared page in a thread of the model: from a snapshot, discarding the page's
/// content (it writes zeros) between `begin_purge` and `finish_purge`. Returns whether it
/// purged.
fn purge_page(p: &Arc<SharedPage>, page: &Arc<Page>) -> thread::JoinHandle<bool> {
    let (p, page) = (p.clone(), page.clone());
    thread::spawn(move || {
        let seen = p.load();
        if !p.begin_purge(seen) {
            return false;
        }
        page.write(0);
        p.finish_purge();
        true
    })
}

/// Holder `h` pins the shared page it had unpinned and reads it: zero if the pin reported a
/// purge, the content otherwise (the read races with no discard: loom checks it). Returns
/// whether it reported a purge.
fn pin_and_read(p: &SharedPage, h: u32, page: &Page) -> bool {
    let found = p.pin(h);
    assert_ne!(found, PagePin::Held, "it had unpinned");
    let lost = found == PagePin::Purged;
    assert_eq!(
        page.read(),
        if lost { 0 } else { CONTENT },
        "found {found:?}"
    );
    lost
}

/// Scenario 5: a shared page of two holders (processes; threads here): holder 0 has unpinned
/// it already and pins it again; holder 1 unpins it and pins it again; a purger purges it from
/// a snapshot meanwhile.
///
/// - A purge starts only when both holders have dropped their pins, so it never races with a
///   holder using the page.
/// - A holder whose pin comes after a purge reports it purged, whether it finds the page
///   `PURGED` (the first) or pinned again by the other (which may have refilled it): neither
///   reports a loss that did not happen, and neither misses one (the purge's lost bits are
///   set before its word leaves `PURGING`: set after, the second pin misses the purge within
///   two preemptions).
#[test]
fn shared_page_pins() {
    check(Some(THREE_THREAD_PREEMPTIONS), || {
        let p = Arc::new(SharedPage::new_pinned(0));
        assert_eq!(p.pin(1), PagePin::Intact); // the second holder maps it and pins
        assert_eq!(p.unpin(0, 1), PageUnpin::StillPinned);
        assert_eq!(state::holders(p.load()), 0b10);
        let page = Arc::new(Page::new());

        let holder = |h: u32, unpin: bool| {
            let (p, page) = (p.clone(), page.clone());
            move || {
                if unpin {
                    let unpinned = p.unpin(h, 2);
                    assert!(
                        matches!(unpinned, PageUnpin::Now | PageUnpin::StillPinned),
                        "unpin: {unpinned:?}"
                    );
                }
                pin_and_read(&p, h, &page)
            }
        };

        let purger = purge_page(&p, &page);
        let b = thread::spawn(holder(1, true));
        let a = thread::spawn(holder(0, false));

        let lost_a = a.join().unwrap();
        let lost_b = b.join().unwrap();
        let purged = purger.join().unwrap();

        assert_eq!(lost_a, purged, "holder 0");
        assert_eq!(lost_b, purged, "holder 1");
        let word = p.load();
        assert_eq!(state::tag(word), state::PINNED);
        assert_eq!(state::holders(word), 0b11);
    });
}

/// Scenario 6: holder 0 died holding the page; another process releases its pin for it (the
/// reaper) while the live holder 1 unpins and pins again and a purger purges from a snapshot.
///
/// - The reaper drops only the dead holder's pin: the live holder's pin is never lost (the
///   page ends pinned by holder 1 alone).
/// - The page is purged only once both pins are gone, never while holder 1 uses it, and
///   holder 1 reports the loss exactly when it happened.
#[test]
fn dead_holder_released_while_the_other_pins() {
    check(Some(THREE_THREAD_PREEMPTIONS), || {
        let p = Arc::new(SharedPage::new_pinned(0));
        assert_eq!(p.pin(1), PagePin::Intact);
        let page = Arc::new(Page::new());

        let reaper = {
            let p = p.clone();
            thread::spawn(move || {
                let released = p.unpin(0, 7);
                assert_ne!(released, PageUnpin::NotHeld, "the dead holder pinned it");
                p.forget(0);
            })
        };
        let purger = purge_page(&p, &page);
        let live = {
            let (p, page) = (p.clone(), page.clone());
            thread::spawn(move || {
                p.unpin(1, 3);
                pin_and_read(&p, 1, &page)
            })
        };

        let lost = live.join().unwrap();
        reaper.join().unwrap();
        let purged = purger.join().unwrap();
        assert_eq!(lost, purged);
        let word = p.load();
        assert_eq!(state::tag(word), state::PINNED);
        assert_eq!(
            state::holders(word),
            0b10,
            "the live holder's pin was released"
        );
    });
}
