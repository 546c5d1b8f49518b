//! [`make_room`]: room made in the caller's thread before it maps memory, from the global
//! order when a coordinator is live.

use super::config;
use super::flush;
use super::participant;
use super::purge::candidates;
use super::victims;
use super::waker::wake;
use super::DISABLED;
use super::STATE;
use crate::lock::Rank;
use crate::lock::RankedMutex;
use crate::registry::pause;
use crate::stats;
use crate::stats::Source;
use std::sync::atomic::Ordering::Relaxed;
use vrange_sys::clock::now_ns;
use vrange_sys::pressure::OwnHeadroom;

/// The headroom file of [`make_room`]'s callers (the thread keeps its own).
static ROOM: RankedMutex<OwnHeadroom> = RankedMutex::new(Rank::Room, OwnHeadroom::new());

/// Makes room, in the caller's thread, before it allocates `bytes` more: if its memory
/// cgroup's headroom (limit minus usage) less `bytes` is under the `VRANGE_HEADROOM` threshold,
/// volatile memory is purged until twice the threshold is free again, as the thread would do
/// at its next tick. Returns the bytes this process purged on its own (counted under
/// [`Source::Headroom`]).
///
/// For clients that fill volatile memory faster than the thread's tick (a cache filling at
/// memory speed can pass a container's limit between two ticks, and volatile memory that is
/// not yet armed is memory the kernel cannot reclaim without swap). Runs the flush hooks
/// ([`on_flush`](super::on_flush)) first, then costs two `pread`s (the cgroup's usage and its `memory.stat`) on verified
/// descriptors; one caller at a time (others return 0 at once, or, coordinated, wait for the
/// answer the first is waiting for).
///
/// While a coordinator (`vrange daemon`) is live, the purge follows its global order instead
/// of this process's own: the caller asks the coordinator for the room and waits for the
/// round it runs (the oldest volatile data of any process in the container goes first, this
/// process's own only in its turn, by the coordinator's request), at most three ping
/// intervals. It purges on its own only for what the coordinator could not free (it saw
/// nothing volatile, or this process's cgroup is short where others' purges do not help) and
/// when the coordinator does not answer or is gone, as without one.
/// Nothing is purged without a cgroup limit, with `VRANGE_HEADROOM=off`, or while the
/// reclaimer is disabled.
pub fn make_room(bytes: usize) -> usize {
    /// Rounds asked of a coordinator for one call before the rest is purged here.
    const ASKS: usize = 3;
    let setting = config::get().headroom.load(Relaxed);
    if setting == 0 || STATE.load(Relaxed) == DISABLED {
        return 0;
    }
    flush::run();
    // Coordinated, the room may come from other processes' data.
    let coordinated = participant::live();
    if stats::volatile_resident() == 0 && !coordinated {
        return 0;
    }
    let t0 = now_ns();
    // The headroom file is read by one caller at a time. Uncoordinated, the others return at
    // once (a purge takes microseconds); coordinated, they wait for the read and then for the
    // coordinator's answer with the first (one request at a time), rather than map past the
    // limit meanwhile. The lock is never held while waiting for the coordinator, so that a
    // fork cannot leave it held for long.
    let deficit_now = || {
        let room = if coordinated {
            Some(ROOM.lock())
        } else {
            ROOM.try_lock()
        };
        let mut room = room?;
        room_deficit(&mut room, bytes as u64, setting, t0)
    };
    let Some(mut deficit) = deficit_now() else {
        return 0;
    };
    for _ in 0..ASKS {
        if deficit == 0 {
            return 0;
        }
        match participant::ask_room(deficit, wake) {
            participant::Room::Answered(Some(_)) | participant::Room::Waited => {}
            // Nothing volatile in the coordinator's eyes, or no answer: on our own.
            participant::Room::Answered(None) | participant::Room::NoAnswer => break,
        }
        let Some(left) = deficit_now() else {
            return 0;
        };
        deficit = left;
    }
    if deficit == 0 {
        return 0;
    }
    let victims = candidates(deficit);
    let p = pause();
    let (ranges, freed) = victims::purge_oldest(&victims, deficit);
    drop(p);
    stats::record(Source::Headroom, ranges, freed, now_ns() - t0);
    freed as usize
}

/// Bytes this process's memory cgroup can still charge before its free memory falls under the
/// `VRANGE_HEADROOM` threshold (the limit, less the usage, plus the clean page cache, less the
/// threshold; 0 when under it); `None` without a limit (or while its files cannot be read).
/// Two `pread`s (the usage, `memory.stat`) on kept descriptors, under a short lock shared with
/// [`make_room`].
///
/// For a client that can give back memory of its own instead of taking more (a page cache
/// recycling its oldest unused page) when memory is short, without purging anyone's.
pub fn room_left() -> Option<u64> {
    let setting = config::get().headroom.load(Relaxed);
    let mut room = ROOM.lock();
    let h = room.get(now_ns())?;
    let headroom = h.bytes().ok()?;
    Some(headroom.saturating_sub(victims::threshold(setting, h.ceiling())))
}

/// Bytes [`make_room`] must free before `bytes` more are allocated: twice the threshold less
/// the headroom that would be left. `None` where there is no limit to keep under (or its file
/// cannot be read).
fn room_deficit(room: &mut OwnHeadroom, bytes: u64, setting: u64, now: u64) -> Option<u64> {
    let h = room.get(now)?;
    let headroom = h.bytes().ok()?;
    Some(victims::headroom_deficit(
        headroom.saturating_sub(bytes),
        victims::threshold(setting, h.ceiling()),
    ))
}
