//! The order a refill region's blocks were filled in: a bounded queue of block indices, oldest
//! first, that any number of threads push to and pop from at once, a SIGBUS handler too (a fill
//! on the faulting thread lists its block; one short of memory takes the oldest to recycle).
//! Never allocates or locks after [`Order::new`], and never waits for another thread.
//!
//! Each cell has a sequence number saying whose turn it is (the bounded queue of Dmitry
//! Vyukov): a pusher at position `p` claims the tail by a compare-exchange once the cell's
//! number is `p`, writes the index and publishes `p + 1`; a popper at `p` claims the head once
//! the number is `p + 1`, reads the index and publishes `p + capacity`, the cell's next push.
//! By hand rather than a library's queue because a handler may interrupt its own thread between
//! a claim and its publish: here the handler then finds the cell not ready and treats the
//! queue as empty (a pop) or full (a push) at once, where a queue that waits for the claimed
//! cell (crossbeam's `ArrayQueue` does) would wait forever for the thread it interrupted.
//!
//! This file depends only on `crate::sync`, so that the loom model (`tests/loom_order.rs`)
//! compiles it against loom's atomics.

use crate::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use crate::sync::atomic::{AtomicU32, AtomicUsize};

/// One place of the queue.
struct Cell {
    /// `p` when a push at position `p` may take it, `p + 1` when the pop at `p` may.
    seq: AtomicUsize,
    block: AtomicU32,
}

/// Block indices, oldest first (see the module documentation).
pub(crate) struct Order {
    cells: Box<[Cell]>,
    /// The next position to pop.
    head: AtomicUsize,
    /// The next position to push.
    tail: AtomicUsize,
}

impl Order {
    /// A queue of `capacity` indices at most (rounded up to a power of two, at least 2).
    pub(crate) fn new(capacity: usize) -> Order {
        let n = capacity.max(2).next_power_of_two();
        Order {
            cells: (0..n)
                .map(|i| Cell {
                    seq: AtomicUsize::new(i),
                    block: AtomicU32::new(0),
                })
                .collect(),
            head: AtomicUsize::new(0),
            tail: AtomicUsize::new(0),
        }
    }

    fn cell(&self, pos: usize) -> &Cell {
        &self.cells[pos & (self.cells.len() - 1)]
    }

    /// Lists `block` as the newest. When the queue is full the oldest goes unlisted to make
    /// room (it is then never recycled, only taken by the kernel); where another thread is
    /// popping the very cell this needs, `block` goes unlisted too rather than wait.
    pub(crate) fn push(&self, block: u32) {
        if !self.try_push(block) {
            let _ = self.pop();
            let _ = self.try_push(block);
        }
    }

    fn try_push(&self, block: u32) -> bool {
        let mut pos = self.tail.load(Relaxed);
        loop {
            let cell = self.cell(pos);
            let seq = cell.seq.load(Acquire);
            match seq.wrapping_sub(pos) as isize {
                0 => match self
                    .tail
                    .compare_exchange(pos, pos.wrapping_add(1), Relaxed, Relaxed)
                {
                    Ok(_) => {
                        cell.block.store(block, Relaxed);
                        // The index before the turn: a popper that sees `pos + 1` reads it.
                        cell.seq.store(pos.wrapping_add(1), Release);
                        return true;
                    }
                    Err(now) => pos = now,
                },
                // Full, or the pop of the cell's last turn is still under way.
                d if d < 0 => return false,
                // Others pushed past `pos` meanwhile.
                _ => pos = self.tail.load(Relaxed),
            }
        }
    }

    /// Takes the oldest index listed, if any is ready.
    pub(crate) fn pop(&self) -> Option<u32> {
        let mut pos = self.head.load(Relaxed);
        loop {
            let cell = self.cell(pos);
            let seq = cell.seq.load(Acquire);
            match seq.wrapping_sub(pos.wrapping_add(1)) as isize {
                0 => match self
                    .head
                    .compare_exchange(pos, pos.wrapping_add(1), Relaxed, Relaxed)
                {
                    Ok(_) => {
                        let block = cell.block.load(Relaxed);
                        // Read before the turn passes to the next push of this cell.
                        cell.seq.store(pos.wrapping_add(self.cells.len()), Release);
                        return Some(block);
                    }
                    Err(now) => pos = now,
                },
                // Empty, or the push at `pos` is still under way.
                d if d < 0 => return None,
                // Others popped past `pos` meanwhile.
                _ => pos = self.head.load(Relaxed),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oldest_first_and_the_oldest_goes_when_full() {
        let q = Order::new(3);
        assert_eq!(q.pop(), None);
        for b in 1..=4 {
            q.push(b);
        }
        assert_eq!(q.pop(), Some(1));
        q.push(5);
        q.push(6);
        // Four places: 6 pushed out the oldest, 2.
        assert_eq!(
            std::iter::from_fn(|| q.pop()).collect::<Vec<_>>(),
            [3, 4, 5, 6]
        );
        // Around the ring many times.
        for b in 0..1000 {
            q.push(b);
            assert_eq!(q.pop(), Some(b));
        }
        assert_eq!(q.pop(), None);
    }

    #[test]
    fn threads_pushing_and_popping_lose_nothing_while_it_has_room() {
        const EACH: u32 = 20_000;
        let q = Order::new(1 << 16);
        let popped = std::sync::Mutex::new(Vec::new());
        std::thread::scope(|s| {
            for t in 0..2u32 {
                let q = &q;
                s.spawn(move || (0..EACH).for_each(|i| q.push(t * EACH + i)));
            }
            for _ in 0..2 {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    for _ in 0..EACH {
                        mine.extend(q.pop());
                    }
                    popped.lock().unwrap().extend(mine);
                });
            }
        });
        let mut all = popped.into_inner().unwrap();
        all.extend(std::iter::from_fn(|| q.pop()));
        all.sort_unstable();
        assert_eq!(all, (0..2 * EACH).collect::<Vec<_>>());
    }
}
