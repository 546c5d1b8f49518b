//! Loom model check of the registry's slot arena (`src/slots.rs`): a scan without a lock (the
//! reclaimer's) reaches only chunks that are published and sees their slots as they were made,
//! however the arena grows meanwhile; and the free list hands each slot to one owner at a time.
//! `slots.rs` depends only on `crate::sync`, so it is compiled here against the loom shim, with
//! slots of the model's own.

// ci: host only: a model of the slot arena, not of the kernel

#[allow(dead_code)] // each model uses part of it
mod loom_shim;

use loom::cell::UnsafeCell;
use loom::sync::{Arc, Mutex};
pub(crate) use loom_shim::sync;
use loom_shim::{both, check};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};

#[path = "../src/slots.rs"]
#[allow(dead_code)]
mod slots;

use slots::{Arena, Linked, NONE};
use sync::atomic::{AtomicPtr, AtomicU32};

/// A slot of the model: the free list's link, a value written when its chunk is made (which a
/// scan reads), and whether an owner holds it.
struct Slot {
    next_free: AtomicU32,
    made: UnsafeCell<u32>,
    owned: loom::sync::atomic::AtomicBool,
}

impl Linked for Slot {
    fn next_free(&self) -> &AtomicU32 {
        &self.next_free
    }
}

/// What every slot of a fresh chunk holds.
const MADE: u32 = 7;

fn new_chunk(slots: usize) -> Option<*mut Slot> {
    let chunk: Box<[Slot]> = (0..slots)
        .map(|_| Slot {
            next_free: AtomicU32::new(NONE),
            made: UnsafeCell::new(MADE),
            owned: loom::sync::atomic::AtomicBool::new(false),
        })
        .collect();
    Some(Box::leak(chunk).as_mut_ptr())
}

/// An arena of `chunks` chunks of `1 << shift` slots, leaked (threads borrow it for `'static`).
fn arena(chunks: usize, shift: u32) -> Arena<'static, Slot> {
    Arena {
        chunks: Box::leak(
            (0..chunks)
                .map(|_| AtomicPtr::new(std::ptr::null_mut()))
                .collect(),
        ),
        chunk_shift: shift,
        high: Box::leak(Box::new(AtomicU32::new(1))),
        free_head: Box::leak(Box::new(AtomicU32::new(NONE))),
        new_chunk,
    }
}

fn copy(a: &Arena<'static, Slot>) -> Arena<'static, Slot> {
    Arena {
        chunks: a.chunks,
        chunk_shift: a.chunk_shift,
        high: a.high,
        free_head: a.free_head,
        new_chunk: a.new_chunk,
    }
}

/// One slot per chunk: every slot handed out maps a chunk. A scan meanwhile reaches only
/// published chunks and reads what their making wrote without a race.
#[test]
fn a_scan_sees_only_published_chunks() {
    check(None, || {
        let a = arena(4, 0);
        let lock = Arc::new(Mutex::new(()));
        let grower = copy(&a);
        let scanner = copy(&a);
        let ((), seen) = both(
            move || {
                for _ in 0..2 {
                    let _held = lock.lock().unwrap();
                    grower.alloc_locked().unwrap();
                }
            },
            move || {
                let mut seen = 0;
                scanner.for_each(|_, s| {
                    // SAFETY: loom checks that this read is ordered after the chunk's making.
                    assert_eq!(s.made.with(|p| unsafe { *p }), MADE);
                    seen += 1;
                });
                seen
            },
        );
        assert!(seen <= 2);
        assert_eq!(a.high(), 3);
    });
}

/// Two owners each take a slot, give it back and take one again, under the arena's lock: no
/// slot is held by two at once, and a freed slot is reused before the arena grows further.
#[test]
fn the_free_list_hands_a_slot_to_one_owner_at_a_time() {
    check(None, || {
        let a = arena(2, 1);
        let lock = Arc::new(Mutex::new(()));
        let owner = |a: Arena<'static, Slot>, lock: Arc<Mutex<()>>| {
            move || {
                let take = || {
                    let idx = lock.lock().unwrap();
                    let idx = {
                        let _held = idx;
                        a.alloc_locked().unwrap()
                    };
                    assert!(
                        !a.get(idx).owned.swap(true, Acquire),
                        "slot {idx} handed out twice"
                    );
                    idx
                };
                let give = |idx: u32| {
                    a.get(idx).owned.store(false, Release);
                    let _held = lock.lock().unwrap();
                    a.free_locked(idx);
                };
                let first = take();
                give(first);
                let second = take();
                give(second);
            }
        };
        both(owner(copy(&a), lock.clone()), owner(copy(&a), lock));
        assert!(a.high() <= 3, "two owners need two slots: {}", a.high());
        let mut free = 0;
        let mut at = a.free_head.load(Relaxed);
        while at != NONE {
            free += 1;
            at = a.get(at).next_free.load(Relaxed);
        }
        assert_eq!(free, a.high() - 1, "every slot back on the list");
    });
}
