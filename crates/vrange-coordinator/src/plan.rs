//! Where to cut the one global order: pure functions of the participants' inventories (tested
//! with made-up ones). The order itself is the core's (`vrange::order`): each inventory cell
//! (class, age bucket) stands at the [`Place`] of its bucket's floor.

use vrange::coordination::{bucket_floor_ms, Inventory, BUCKETS, CLASSES};
use vrange::order::{self, Place};

/// A cut of the global order (`vrange::order::Cut`, idle times in milliseconds) and the bytes
/// before it by the inventories.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    /// The point in the order: every class below `at.class`, and of `at.class` what has been
    /// volatile for at least `at.min_idle` ms, comes before it.
    pub at: order::Cut,
    /// Bytes before the cut, by the inventories.
    pub bytes: u64,
    /// Of what comes before `at`, only memory volatile for at least this long (ms; 0: all): a
    /// proactive step's floor.
    pub floor_ms: u64,
}

impl Cut {
    /// Whether everything before `other` is before `self` too (`self` reaches as far).
    pub fn covers(&self, other: &Cut) -> bool {
        self.at.covers(&other.at) && self.floor_ms <= other.floor_ms
    }

    /// Whether memory of `class` volatile for `idle_ms` comes before the cut.
    pub fn admits(&self, class: u8, idle_ms: u64) -> bool {
        idle_ms >= self.floor_ms && self.at.admits(Place::new(class, idle_ms))
    }
}

/// Where the bytes of cell (`class`, `bucket`) stand in the order.
fn place(class: usize, bucket: usize) -> Place {
    Place::new(class as u8, bucket_floor_ms(bucket))
}

/// The bytes of every inventory, summed by class and bucket.
pub fn merge<'a>(
    inventories: impl IntoIterator<Item = &'a Inventory>,
) -> [[u64; BUCKETS]; CLASSES] {
    let mut all = [[0u64; BUCKETS]; CLASSES];
    for inv in inventories {
        for (c, row) in inv.volatile.iter().enumerate() {
            for (b, v) in row.iter().enumerate() {
                all[c][b] = all[c][b].saturating_add(*v);
            }
        }
    }
    all
}

/// `inv` as it would read `elapsed` later: each bucket's bytes moved to the bucket of its lower
/// bound plus the time passed (a bucket's bytes stay together; they are at least that old).
pub fn aged(inv: &Inventory, elapsed: std::time::Duration) -> Inventory {
    let ms = elapsed.as_millis() as u64;
    let mut out = Inventory {
        volatile: [[0; BUCKETS]; CLASSES],
        ..inv.clone()
    };
    for (c, row) in inv.volatile.iter().enumerate() {
        for (b, v) in row.iter().enumerate() {
            let to = vrange::coordination::bucket_of(bucket_floor_ms(b).saturating_add(ms));
            out.volatile[c][to] += v;
        }
    }
    out
}

/// The latest cut whose bytes reach `target`, walking whole buckets in the victim order.
/// `None` if nothing is volatile; everything if the target is more than all.
pub fn cut(merged: &[[u64; BUCKETS]; CLASSES], target: u64) -> Option<Cut> {
    let mut cells: Vec<(Place, u64)> = (0..CLASSES)
        .flat_map(|c| (0..BUCKETS).map(move |b| (c, b)))
        .filter(|&(c, b)| merged[c][b] != 0)
        .map(|(c, b)| (place(c, b), merged[c][b]))
        .collect();
    cells.sort_unstable_by_key(|&(p, _)| p);
    let mut bytes = 0u64;
    let mut last = None;
    for (p, v) in cells {
        bytes = bytes.saturating_add(v);
        last = Some(Cut {
            at: order::Cut::after(p),
            bytes,
            floor_ms: 0,
        });
        if bytes >= target {
            break;
        }
    }
    last
}

/// The latest cut reaching `target` bytes over memory volatile for at least `min_idle_ms` (a
/// proactive step's): the cells of every class whose bucket floor is that old, in the victim
/// order, with the floor on the cut, so that younger memory of a lower class (which an
/// ordinary cut into a higher class passes whatever its age) stays. `None` if none is so old.
pub fn cold_cut(merged: &[[u64; BUCKETS]; CLASSES], target: u64, min_idle_ms: u64) -> Option<Cut> {
    let mut cold = [[0u64; BUCKETS]; CLASSES];
    for (c, row) in merged.iter().enumerate() {
        for (b, v) in row.iter().enumerate() {
            if bucket_floor_ms(b) >= min_idle_ms {
                cold[c][b] = *v;
            }
        }
    }
    cut(&cold, target).map(|c| Cut {
        floor_ms: min_idle_ms,
        ..c
    })
}

/// Bytes before `cut` in one inventory (whether a participant is asked at all).
pub fn before(inv: &Inventory, cut: &Cut) -> u64 {
    let mut bytes = 0u64;
    for (class, row) in inv.volatile.iter().enumerate() {
        for (bucket, v) in row.iter().enumerate() {
            if cut.admits(class as u8, bucket_floor_ms(bucket)) {
                bytes = bytes.saturating_add(*v);
            }
        }
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use vrange::coordination::bucket_of;

    fn inv(entries: &[(usize, u64, u64)]) -> Inventory {
        let mut i = Inventory::default();
        for &(class, age_ms, bytes) in entries {
            i.volatile[class][bucket_of(age_ms)] += bytes;
        }
        i
    }

    #[test]
    fn lowest_class_first_then_oldest_across_participants() {
        let a = inv(&[(2, 60_000, 10), (2, 1_000, 10)]);
        let b = inv(&[(2, 30_000, 10), (0, 10, 5)]);
        let m = merge([&a, &b]);
        // The low class goes first, however young.
        let c = cut(&m, 5).unwrap();
        assert_eq!((c.at.class, c.bytes), (0, 5));
        assert_eq!(before(&a, &c), 0);
        assert_eq!(before(&b, &c), 5);
        // Then A's oldest, then B's, before A's young data.
        let c = cut(&m, 15).unwrap();
        assert_eq!((c.at.class, c.bytes), (2, 15));
        assert_eq!(before(&a, &c), 10);
        assert_eq!(before(&b, &c), 5);
        let c = cut(&m, 25).unwrap();
        assert_eq!(c.bytes, 25);
        assert_eq!(before(&b, &c), 15);
        assert_eq!(before(&a, &c), 10);
        assert!(c.at.min_idle <= 30_000 && c.at.min_idle > 1_000);
        // A later cut reaches as far as an earlier one, not the other way round.
        let (early, late) = (cut(&m, 5).unwrap(), cut(&m, 25).unwrap());
        assert!(late.covers(&early) && late.covers(&late));
        assert!(!early.covers(&late));
        assert!(cut(&m, 25).unwrap().covers(&cut(&m, 15).unwrap()));
        assert!(!cut(&m, 15).unwrap().covers(&cut(&m, 25).unwrap()));
        // More than everything: the last cut, everything.
        assert_eq!(cut(&m, 1000).unwrap().bytes, 35);
        assert_eq!(cut(&merge([&Inventory::default()]), 1), None);
    }

    #[test]
    fn a_cold_cut_passes_only_memory_idle_long_enough_in_every_class() {
        // Class 1 holds only young data; class 2 old and young; class 3 only old.
        let a = inv(&[
            (1, 1_000, 10),
            (2, 120_000, 10),
            (2, 40_000, 10),
            (2, 1_000, 10),
            (3, 600_000, 10),
        ]);
        let m = merge([&a]);
        // Idle at least 30 s: class 2's two old cells, oldest first, never the young ones
        // (class 1's, younger than the floor, though its class comes first).
        let c = cold_cut(&m, 5, 30_000).unwrap();
        assert_eq!((c.at.class, c.bytes, c.floor_ms), (2, 10, 30_000));
        assert!(c.admits(2, 120_000) && !c.admits(2, 40_000) && !c.admits(1, 1_000));
        assert_eq!(before(&a, &c), 10);
        let c = cold_cut(&m, 20, 30_000).unwrap();
        assert_eq!(c.bytes, 20);
        assert!(c.admits(2, 40_000) && !c.admits(2, 1_000) && !c.admits(1, 1_000));
        assert!(!c.admits(3, 600_000));
        // Then class 3's old data.
        let c = cold_cut(&m, 100, 30_000).unwrap();
        assert_eq!((c.at.class, c.bytes), (3, 30));
        assert!(c.admits(3, 600_000) && c.admits(2, 40_000));
        assert!(!c.admits(1, 1_000) && !c.admits(2, 1_000));
        assert_eq!(before(&a, &c), 30);
        // A floor never covers a cut without one that reaches as far.
        let plain = cut(&m, 100).unwrap();
        assert!(plain.covers(&c) && !c.covers(&plain));
        // Nothing so old: nothing.
        assert_eq!(cold_cut(&m, 100, 1_000_000), None);
        assert_eq!(cold_cut(&merge([&Inventory::default()]), 1, 0), None);
    }

    #[test]
    fn a_stale_inventory_is_aged_before_it_is_compared() {
        let old = inv(&[(2, 1_000, 10)]);
        let later = aged(&old, std::time::Duration::from_secs(10));
        assert_eq!(later.volatile_total(), 10);
        assert_eq!(later.volatile[2][bucket_of(11_000)], 10);
        // A fresh report of data 5 s old now comes after the stale one's.
        let fresh = inv(&[(2, 5_000, 10)]);
        let c = cut(&merge([&later, &fresh]), 10).unwrap();
        assert_eq!(before(&later, &c), 10);
        assert_eq!(before(&fresh, &c), 0);
    }
}
