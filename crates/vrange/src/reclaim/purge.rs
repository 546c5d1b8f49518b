//! Purges in the caller's thread ([`purge`], a region's own) and the thread's answer to a
//! source: candidates are collected, then purged oldest first under the purge lock.

use super::ensure_running;
use super::flush;
use super::victims;
use crate::managed::{ARMS_BEGUN, ARMS_DONE};
use crate::registry::pause;
use crate::stats;
use crate::stats::Source;
use std::sync::atomic::Ordering::SeqCst;
use vrange_sys::clock::now_ns;

/// Purges up to `bytes` bytes of volatile managed ranges now, lowest class and least recently
/// used first, whole ranges at a time (so it may free more than asked). Returns the bytes
/// freed: the lengths of the ranges purged. Runs in the caller's thread.
pub fn purge(bytes: usize) -> usize {
    /// Passes over fresh candidates at most (see below).
    const PASSES: usize = 3;
    let t0 = now_ns();
    let target = bytes as u64;
    let (mut ranges, mut freed) = (0, 0);
    // The reclaimer arms hybrid ranges under the purge lock, so between this thread's
    // snapshot of the candidates and its taking that lock a range may be mid-arming (no
    // candidate) or armed since (its snapshot word stale): a pass skips either. An explicit
    // purge does not leave them behind: once it has held the lock, the arming it raced is
    // over, and a fresh snapshot has them.
    for _ in 0..PASSES {
        // An arming in progress at the snapshot (finished is read first: one begun in between
        // counts too), or begun since.
        let done = ARMS_DONE.load(SeqCst);
        let begun = ARMS_BEGUN.load(SeqCst);
        let victims = candidates(target - freed);
        let p = pause();
        let raced = begun != done || ARMS_BEGUN.load(SeqCst) != begun;
        let (r, f) = victims::purge_oldest(&victims, target - freed);
        drop(p);
        ranges += r;
        freed += f;
        // Short of the target, every candidate was tried: some that were not purged changed
        // under the snapshot.
        let missed = victims.len() as u64 > r;
        if freed >= target || !(missed || raced) {
            break;
        }
    }
    stats::record(Source::Explicit, ranges, freed, now_ns() - t0);
    ensure_running();
    freed as usize
}

/// Purges the volatile ranges of one region now (`VolatileRegion::purge`), counted as an
/// explicit purge. Returns the bytes freed.
pub(crate) fn purge_region(span: crate::span::Span) -> Result<usize, crate::Error> {
    let t0 = now_ns();
    let p = pause();
    let done = crate::managed::purge_span(span);
    drop(p);
    let (ranges, freed) = done?;
    stats::record(Source::Explicit, ranges, freed, now_ns() - t0);
    Ok(freed as usize)
}

/// The purge candidates for a target (none for a zero target), collected before the purge lock
/// is taken: see [`victims::candidates`].
pub(super) fn candidates(target: u64) -> Vec<victims::Candidate> {
    if target == 0 {
        Vec::new()
    } else {
        flush::run();
        victims::candidates()
    }
}

pub(super) fn respond(source: Source, since: u64, target: u64) {
    let victims = candidates(target);
    let p = pause();
    let (ranges, bytes) = victims::purge_oldest(&victims, target);
    drop(p);
    stats::record(source, ranges, bytes, now_ns().saturating_sub(since));
}
