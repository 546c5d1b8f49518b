//! The coordinator's rounds against participants played by the test itself over the real
//! socket (their inventories made up, their answers chosen), so that the order of requests is
//! seen exactly, whatever the machine is doing.
//!
//! - `room_asked_during_a_round_waits_for_the_busy_participants_older_data`: a participant
//!   busy with a round's request holds the oldest data; a younger one asks for room meanwhile.
//!   The room comes from the busy one's data (asked of it as soon as it answers), never from
//!   the young one's.

mod common;

use common::socket_dir;
use std::os::fd::BorrowedFd;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};
use vrange::coordination::{bucket_of, Inventory, Message, MAX_MESSAGE, NAME_LEN};
use vrange_coordinator::{Options, Scope, Shared};
use vrange_sys::fd::GuestFd;
use vrange_sys::sock::{self, Recv};

const MIB: u64 = 1 << 20;
/// The class of ordinary volatile data.
const CLASS: usize = 2;

/// A participant played by the test.
struct Fake {
    fd: GuestFd,
}

impl Fake {
    /// Connects, says `Hello`, and reports `inv` as its inventory.
    fn join(socket: &Path, name: &str, inv: Inventory) -> Fake {
        let fd = sock::connect(socket).expect("connect to the coordinator");
        let mut n = [0u8; NAME_LEN];
        n[..name.len()].copy_from_slice(name.as_bytes());
        let me = Fake { fd };
        me.send(&Message::Hello {
            pid: std::process::id(),
            name: n,
        });
        me.send(&Message::Inventory(Box::new(inv)));
        me
    }

    fn conn(&self) -> BorrowedFd<'_> {
        self.fd.get().expect("the test's own descriptor")
    }

    fn send(&self, m: &Message) {
        let mut buf = [0u8; MAX_MESSAGE];
        let n = m.encode(&mut buf);
        assert_eq!(sock::send(self.conn(), &buf[..n]).ok(), Some(true), "{m:?}");
    }

    /// The next `Purge` or `Roomed` within `timeout` (`Welcome` and `Ping` are skipped).
    fn next(&self, timeout: Duration) -> Option<Message> {
        let deadline = Instant::now() + timeout;
        let mut buf = [0u8; MAX_MESSAGE];
        loop {
            match sock::recv(self.conn(), &mut buf).expect("recv") {
                Recv::Message(n) => match Message::decode(&buf[..n]).expect("well-formed") {
                    Message::Welcome { .. } | Message::Ping { .. } => continue,
                    m => return Some(m),
                },
                Recv::Closed => panic!("the coordinator hung up"),
                Recv::TooLong => panic!("an oversized message"),
                Recv::Empty => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            let mut set = [sock::poll_in(self.fd.raw())];
            let ms = left.as_millis().clamp(1, 1000) as i32;
            sock::poll(&mut set, ms).expect("poll");
        }
    }
}

/// Stops the coordinator however the test ends (a failed assertion included), so that the
/// thread scope can end.
struct StopOnDrop<'a>(&'a Shared);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.stop.store(true, Relaxed);
    }
}

/// An inventory of `bytes` at each age (ms), all of the ordinary class.
fn inventory(entries: &[(u64, u64)]) -> Inventory {
    let mut inv = Inventory::default();
    for &(age_ms, bytes) in entries {
        inv.volatile[CLASS][bucket_of(age_ms)] += bytes;
    }
    inv
}

#[test]
fn room_asked_during_a_round_waits_for_the_busy_participants_older_data() {
    let dir = socket_dir("rounds");
    let socket = dir.join("coordinator.sock");
    // The machine's scope: no cgroup needed. Pings and timeouts far beyond the test, so that
    // only the requests below are in play (machine-wide pressure may add a round, which asks
    // at most a quarter of the volatile data: the old one's oldest).
    let opts = Options {
        socket: socket.clone(),
        scope: Scope::Machine,
        ping: Duration::from_secs(60),
        request_timeout: Duration::from_secs(60),
        ..Options::default()
    };
    let shared = Shared::default();
    std::thread::scope(|s| {
        let coordinator = vrange_coordinator::Coordinator::bind(&opts).expect("bind");
        let running = s.spawn(|| coordinator.run(&shared));
        let stop = StopOnDrop(&shared);
        let t0 = Instant::now();
        // The oldest data is the old one's: 16 MiB each at 80, 60, 40 and 30 s.
        let old_ages = [80_000, 60_000, 40_000, 30_000];
        let old = Fake::join(&socket, "old", inventory(&old_ages.map(|a| (a, 16 * MIB))));
        let young = Fake::join(&socket, "young", inventory(&[(0, 64 * MIB)]));
        let starter = Fake::join(&socket, "starter", Inventory::default());
        // A small room request starts a round: the old one is asked, and does not answer yet.
        starter.send(&Message::Room {
            id: 1,
            bytes: 8 * MIB,
        });
        let first = old.next(Duration::from_secs(10));
        let Some(Message::Purge { id, min_age_ms, .. }) = first else {
            panic!("the old one is asked first: {first:?}")
        };
        let mut asked = vec![min_age_ms];
        let mut unanswered = Some((id, min_age_ms));
        // The young one asks for room while the old one is busy.
        young.send(&Message::Room {
            id: 2,
            bytes: 48 * MIB,
        });
        let meanwhile = young.next(Duration::from_secs(1));
        assert!(
            meanwhile.is_none(),
            "the young one is not asked while older data is being purged: {meanwhile:?}"
        );
        // The old one now answers each request (its data before the cut, less what it
        // already gave), until the young one's room is answered.
        let mut freed = 0;
        let deadline = Instant::now() + Duration::from_secs(20);
        let roomed = loop {
            assert!(
                Instant::now() < deadline,
                "no answer to the room: {asked:?}"
            );
            if let Some((id, min_age_ms)) = unanswered.take() {
                let elapsed = t0.elapsed().as_millis() as u64;
                let before: u64 = old_ages
                    .iter()
                    .filter(|&&a| a + elapsed >= min_age_ms)
                    .map(|_| 16 * MIB)
                    .sum();
                let bytes = before.saturating_sub(freed);
                freed += bytes;
                old.send(&Message::Purged {
                    id,
                    bytes,
                    ranges: 1,
                    youngest_ms: min_age_ms,
                });
            }
            match young.next(Duration::from_millis(100)) {
                Some(Message::Roomed { id: 2, cut }) => break cut,
                None => {}
                other => panic!("the young one is never asked to purge: {other:?}"),
            }
            if let Some(m) = old.next(Duration::from_millis(100)) {
                let Message::Purge { id, min_age_ms, .. } = m else {
                    panic!("the old one is only asked to purge: {m:?}")
                };
                asked.push(min_age_ms);
                unanswered = Some((id, min_age_ms));
            }
        };
        assert!(asked.len() >= 2, "asked again once it answered: {asked:?}");
        assert!(
            freed >= 48 * MIB,
            "the room came from the old one's data: {} MiB, {asked:?}",
            freed / MIB
        );
        let (_, cut) = roomed.expect("a cut");
        // Oldest first: each request reaches further than the last.
        assert!(asked.windows(2).all(|w| w[1] <= w[0]), "{asked:?}");
        assert!(
            cut >= 20_000,
            "the cut stays among the old one's data: {cut} ms"
        );
        assert!(
            matches!(
                starter.next(Duration::from_secs(5)),
                Some(Message::Roomed { id: 1, .. })
            ),
            "the first room is answered too"
        );
        drop(stop);
        running
            .join()
            .expect("coordinator thread")
            .expect("coordinator run");
    });
}
