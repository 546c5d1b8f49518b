//! The one victim order: which volatile memory goes first when memory must be given back.
//! Lower class ([`Priority`](crate::Priority)) first; within a class, what has been idle longest.
//!
//! Every purger follows it by calling these types, never by restating the rule: the reclaimer
//! and explicit purges (`reclaim::victims` sorts its candidates by [`Place`]), a coordinator's
//! cut of the global order across processes (vrange-coordinator walks its inventories by
//! [`Place`] and sends a [`Cut`]), the participant obeying that cut ([`Cut::admits`]), and
//! vrange-cache choosing the slab it recycles. A client may pass its own numbers in (the cache
//! counts a probation slab a class below its own); the comparison is this file's.
//!
//! A leaf: it names no other module of the crate.

use std::cmp::Ordering;

/// Where volatile memory stands in the victim order: its class (a
/// [`Priority`](crate::Priority) as `u8`: 0 goes first) and how long it has been idle (any unit,
/// the same for everything compared: the reclaimer uses nanoseconds, a coordinator the floor of
/// an age bucket in milliseconds). The smaller `Place` goes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Place {
    /// The reclaim class; lower classes go first.
    pub class: u8,
    /// Time since last use; within a class, longer goes first.
    pub idle: u64,
}

impl Place {
    /// The place of memory of class `class` idle for `idle`.
    pub const fn new(class: u8, idle: u64) -> Place {
        Place { class, idle }
    }
}

impl Ord for Place {
    fn cmp(&self, other: &Place) -> Ordering {
        self.class
            .cmp(&other.class)
            .then_with(|| other.idle.cmp(&self.idle))
    }
}

impl PartialOrd for Place {
    fn partial_cmp(&self, other: &Place) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// A point in the victim order: everything at or before [`Place`] `(class, min_idle)` is
/// before the cut (every class below `class`, and of `class` what has been idle at least
/// `min_idle`). A coordinator asks each process to purge what comes before its cut, so that
/// the memory purged is a prefix of one order across processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Cut {
    /// The last class the cut reaches into.
    pub class: u8,
    /// Within `class`, the shortest idle time before the cut.
    pub min_idle: u64,
}

impl Cut {
    /// The cut just after `place`: it admits `place` and everything before it.
    pub const fn after(place: Place) -> Cut {
        Cut {
            class: place.class,
            min_idle: place.idle,
        }
    }

    /// The last place before the cut.
    pub const fn last(&self) -> Place {
        Place::new(self.class, self.min_idle)
    }

    /// Whether memory at `place` comes before the cut (is purged by it).
    pub fn admits(&self, place: Place) -> bool {
        place <= self.last()
    }

    /// Whether everything before `other` is before `self` too (`self` reaches as far).
    pub fn covers(&self, other: &Cut) -> bool {
        self.admits(other.last())
    }

    /// The same cut with its idle time in another unit (`min_idle * factor`, saturating): a
    /// coordinator's cut in milliseconds, compared with ranges idle for nanoseconds.
    pub const fn scaled(&self, factor: u64) -> Cut {
        Cut {
            class: self.class,
            min_idle: self.min_idle.saturating_mul(factor),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lower_class_first_then_longest_idle() {
        let mut v = vec![
            Place::new(2, 5),
            Place::new(3, 100),
            Place::new(0, 1),
            Place::new(2, 8),
            Place::new(1, 0),
        ];
        v.sort();
        assert_eq!(
            v,
            [
                Place::new(0, 1),
                Place::new(1, 0),
                Place::new(2, 8),
                Place::new(2, 5),
                Place::new(3, 100)
            ]
        );
    }

    #[test]
    fn a_cut_admits_a_prefix_of_the_order() {
        let cut = Cut::after(Place::new(2, 10));
        assert!(cut.admits(Place::new(1, 0)), "a lower class, however fresh");
        assert!(cut.admits(Place::new(2, 10)), "the place itself");
        assert!(cut.admits(Place::new(2, 11)), "idle longer");
        assert!(!cut.admits(Place::new(2, 9)), "used more recently");
        assert!(!cut.admits(Place::new(3, u64::MAX)), "a higher class");
        // A later cut reaches as far as an earlier one, not the other way round.
        let later = Cut::after(Place::new(2, 3));
        assert!(later.covers(&cut) && later.covers(&later));
        assert!(!cut.covers(&later));
        assert!(Cut::after(Place::new(3, 50)).covers(&later));
        assert_eq!(Cut::after(Place::new(2, 3)).scaled(1000).min_idle, 3000);
        assert_eq!(
            Cut::after(Place::new(2, u64::MAX)).scaled(2).min_idle,
            u64::MAX
        );
    }
}
