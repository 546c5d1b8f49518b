//! Loom model check of the queue of filled blocks (`src/refill_order.rs`): a popper that takes a
//! cell reads the index its pusher wrote (the cell's sequence number hands it over: the index
//! itself is a relaxed atomic, which loom lets return an older value where nothing orders it),
//! no index is taken twice, indices come out oldest first, and a full queue gives up its oldest
//! to a push. `refill_order.rs` depends only on `crate::sync`, so it is compiled here against
//! the loom shim (`loom_shim`).

// ci: host only: a model of the queue, not of the kernel

#[allow(dead_code)] // each model uses part of it
mod loom_shim;

use loom::sync::Arc;
pub(crate) use loom_shim::sync;
use loom_shim::{both, check};

#[path = "../src/refill_order.rs"]
#[allow(dead_code)]
mod refill_order;

use refill_order::Order;

/// What is left in the queue, oldest first.
fn drain(q: &Order) -> Vec<u32> {
    std::iter::from_fn(|| q.pop()).collect()
}

/// A pusher and a popper at once: every index pushed comes out once, in order, whether the
/// popper took it or it was left.
#[test]
fn a_popper_reads_what_was_pushed_in_order() {
    check(None, || {
        let q = Arc::new(Order::new(4));
        let popper = q.clone();
        let pusher = q.clone();
        let ((), taken) = both(
            move || {
                pusher.push(1);
                pusher.push(2);
            },
            move || [popper.pop(), popper.pop()],
        );
        let mut all: Vec<u32> = taken.into_iter().flatten().collect();
        all.extend(drain(&q));
        assert_eq!(all, [1, 2]);
    });
}

/// Two pushers at once take two cells: both indices are listed.
#[test]
fn pushers_take_distinct_cells() {
    check(None, || {
        let q = Arc::new(Order::new(2));
        let (a, b) = (q.clone(), q.clone());
        both(move || a.push(1), move || b.push(2));
        let mut all = drain(&q);
        all.sort_unstable();
        assert_eq!(all, [1, 2]);
    });
}

/// A full queue: a push gives up the oldest to make room while a popper takes from it. No index
/// comes out twice, order holds, and nothing waits: where the popper holds the very cell the
/// push needs (claimed, not yet read), the push gives up, and the newest goes unlisted too.
#[test]
fn a_full_queue_gives_up_its_oldest() {
    check(None, || {
        let q = Arc::new(Order::new(2));
        q.push(1);
        q.push(2);
        let (pusher, popper) = (q.clone(), q.clone());
        let ((), taken) = both(move || pusher.push(3), move || popper.pop());
        assert!(taken.is_some(), "the popper took one of the two listed");
        let mut all: Vec<u32> = taken.into_iter().collect();
        all.extend(drain(&q));
        assert!(all.windows(2).all(|w| w[0] < w[1]), "order: {all:?}");
        assert!(all.iter().all(|b| (1..=3).contains(b)), "{all:?}");
    });
}
