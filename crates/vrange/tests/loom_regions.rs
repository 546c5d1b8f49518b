//! Loom model check of the region table's lock-free protocol (`src/extents.rs`): a region
//! recorded is seen whole (its kind and what its kind keeps) by a reader that finds it, and a
//! region removed is freed only after every reader inside it has left: what its kind keeps is
//! never destroyed under a reader (a fill running in it). `extents.rs` depends only on
//! `crate::sync`, so it is compiled here against the loom shim (`loom_shim`).
//!
//! What a region keeps is a `loom::cell::UnsafeCell`: loom reports any access to it that is not
//! ordered by happens-before, so the models check the protocol's orderings, not just its flags.

// ci: host only: a model of the region table, not of the kernel

#[allow(dead_code)] // each model uses part of it
mod loom_shim;

use loom::cell::UnsafeCell;
use loom::sync::Arc;
pub(crate) use loom_shim::sync;
use loom_shim::{both, check};

#[path = "../src/extents.rs"]
#[allow(dead_code)]
mod extents;

use extents::{Entry, Kind, Table};
use sync::atomic::AtomicUsize;

/// What a region's kind keeps: written by its recorder, read by readers inside, destroyed by
/// its remover.
struct Kept(UnsafeCell<u32>);

// SAFETY: every access to the cell goes through loom, which reports a race.
unsafe impl Sync for Kept {}

impl Kept {
    fn read(&self) -> u32 {
        // SAFETY: loom checks that no write races with this read.
        self.0.with(|p| unsafe { *p })
    }

    fn write(&self, v: u32) {
        // SAFETY: loom checks that no other access races with this write.
        self.0.with_mut(|p| unsafe { *p = v })
    }
}

/// A table of `n` entries, leaked (the model's threads borrow it for `'static`).
fn table(n: usize) -> Table<'static> {
    Table {
        entries: Box::leak((0..n).map(|_| Entry::new()).collect()),
        live: Box::leak(Box::new(AtomicUsize::new(0))),
        high: Box::leak(Box::new(AtomicUsize::new(0))),
    }
}

const START: usize = 0x10000;
const LEN: usize = 0x4000;

/// A reader that finds a region being recorded sees its kind and reads what it keeps without a
/// race with the recorder's write of it.
#[test]
fn a_region_is_seen_whole_once_found() {
    check(None, || {
        let t = table(2);
        let kept = Arc::new(Kept(UnsafeCell::new(0)));
        let written = kept.clone();
        both(
            move || {
                written.write(7);
                let ptr = Arc::as_ptr(&written) as *mut ();
                assert!(t.record(Kind::Refill, START, LEN, ptr).is_some());
            },
            move || {
                if let Some(inside) = t.enter(START + 1) {
                    assert_eq!(inside.entry.kind(), Some(Kind::Refill));
                    let ptr = inside.entry.state() as *const Kept;
                    assert_eq!(ptr, Arc::as_ptr(&kept));
                    // SAFETY: the pointer is the recorder's `kept`, alive (the model holds it).
                    assert_eq!(unsafe { &*ptr }.read(), 7);
                }
            },
        );
    });
}

/// A reader inside a region while it is removed: the remover destroys what the region keeps
/// only after the reader has left, and a reader that comes after the unpublish finds nothing.
#[test]
fn a_region_is_freed_only_after_its_readers_left() {
    check(None, || {
        let t = table(1);
        let kept = Arc::new(Kept(UnsafeCell::new(7)));
        let ptr = Arc::as_ptr(&kept) as *mut ();
        let entry = t.record(Kind::RefillHere, START, LEN, ptr).unwrap();
        let destroyed = kept.clone();
        let ptr = ptr as usize;
        both(
            move || {
                let Some(inside) = t.enter(START + LEN - 1) else {
                    return false;
                };
                // SAFETY: a live region's kept value is alive while this reader is inside.
                let kept = unsafe { &*(inside.entry.state() as *const Kept) };
                assert_eq!(kept.read(), 7, "destroyed under a reader");
                true
            },
            move || {
                assert!(t.unpublish(entry, LEN));
                t.drain(entry);
                assert_eq!(t.free(entry) as usize, ptr);
                // A reader that read the length before the unpublish may count itself in now:
                // it reads the cleared length next and leaves without touching what the region
                // kept.
                destroyed.write(0);
            },
        );
        assert!(t.enter(START).is_none(), "freed: not found");
    });
}

/// Two recorders at once claim two entries; both regions are found afterwards.
#[test]
fn recorders_claim_distinct_entries() {
    check(None, || {
        let t = table(2);
        let (mine, theirs) = both(
            move || {
                t.record(Kind::Scratch, START, LEN, std::ptr::null_mut())
                    .map(|e| e as *const Entry as usize)
            },
            move || {
                t.record(Kind::Scratch, 2 * START, LEN, std::ptr::null_mut())
                    .map(|e| e as *const Entry as usize)
            },
        );
        assert!(mine.is_some() && theirs.is_some() && mine != theirs);
        assert!(t.exactly(Kind::Scratch, START, LEN).is_some());
        assert!(t.exactly(Kind::Scratch, 2 * START, LEN).is_some());
        assert_eq!(t.published().count(), 2);
    });
}
