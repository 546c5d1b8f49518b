//! [`make_room`]: room made in the caller's thread before it maps memory, from the global
//! order when a coordinator is live; [`room`]: how memory stands for a client deciding whether
//! to take more (the rule is `crate::short`'s). Every [`room`] call, and the reclaimer thread
//! at each tick while refill regions filled on the faulting thread live (`thread::keep_room`),
//! publish what they read as the last reading (`crate::last_room`).

use super::config;
use super::flush;
use super::participant;
use super::purge::candidates;
use super::victims;
use super::waker::wake;
use super::DISABLED;
use super::STATE;
use crate::last_room;
use crate::registry::pause;
use crate::short::{self, Room};
use crate::stats;
use crate::stats::Source;
use std::sync::atomic::Ordering::Relaxed;
use vrange_sys::clock::now_ns;
use vrange_sys::lock::{Rank, RankedMutex};
use vrange_sys::pressure::OwnHeadroom;

/// The headroom file of [`make_room`]'s callers (the thread keeps its own).
static ROOM: RankedMutex<OwnHeadroom> = RankedMutex::new(Rank::Room, OwnHeadroom::new());

/// What [`crate::reclaimer::make_room`] does, after it has registered the fork handlers.
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
        room_deficit(&mut room, bytes as u64)
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

/// What [`crate::reclaimer::room`] does, after it has registered the fork handlers.
pub fn room() -> Option<Room> {
    measure(&mut ROOM.lock())
}

/// The cgroup's headroom and threshold, read from `headroom` and published as the last
/// reading. `None` where there is no limit to keep under (or its files cannot be read).
pub(super) fn measure(headroom: &mut OwnHeadroom) -> Option<Room> {
    let setting = config::get().headroom.load(Relaxed);
    let now = now_ns();
    // Before the read: what fills charge from here on is counted against it.
    let charged = last_room::charged_so_far();
    let h = headroom.get(now)?;
    let read = h.read().ok()?;
    let room = Room {
        headroom: read.headroom,
        threshold: short::threshold(setting, h.ceiling()),
        free: read.free,
    };
    let tick = config::get()
        .poll_ms
        .load(Relaxed)
        .saturating_mul(1_000_000);
    let stale = tick
        .saturating_mul(last_room::STALE_TICKS)
        .max(1_000_000_000);
    last_room::publish(&room, charged, now.saturating_add(stale));
    Some(room)
}

/// Bytes [`make_room`] must free before `bytes` more are allocated (`crate::short`).
fn room_deficit(headroom: &mut OwnHeadroom, bytes: u64) -> Option<u64> {
    measure(headroom).map(|r| r.deficit_after(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use vrange_testkit::fork::fork_while;
    use vrange_testkit::proc::Exit;

    /// A fork made while another thread asks for the headroom: the child's own question is
    /// answered (it does not wait for a thread it does not have).
    #[test]
    fn a_fork_child_gets_its_headroom_while_a_parent_thread_asks() {
        // The public call registers the fork handlers.
        let _ = crate::reclaimer::room();
        let exit = fork_while(
            |wait| {
                let _held = ROOM.lock();
                wait();
            },
            || {
                let _ = room();
                let _ = make_room(1 << 20);
                true
            },
            Duration::from_secs(20),
        );
        assert_eq!(exit, Exit::Code(0), "the child's room returned");
    }
}
