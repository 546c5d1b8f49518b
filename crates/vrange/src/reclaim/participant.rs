//! This process as a participant of a coordinator (`vrange daemon`): the reclaimer thread
//! connects when the coordinator's socket exists, answers its pings with an inventory, obeys its
//! purge requests, and while the coordinator is live leaves pressure purges to it. See
//! [`coordination`] for the protocol.
//!
//! | `VRANGE_COORDINATOR` | sockets tried (once a second while none is connected) |
//! |---|---|
//! | unset or empty | `/dev/shm/vrange-<euid>/coordinator.sock`, then `/run/vrange/coordinator.sock` |
//! | an absolute path | that socket |
//! | `off` | none: this process never connects |
//!
//! Another value is reported once on stderr and taken as `off`.
//!
//! - **Authenticated**: the coordinator's credentials (SO_PEERCRED, recorded by the kernel when
//!   it listened) must be this process's effective uid or root; otherwise the connection is
//!   closed before anything is read from it.
//! - **Bounded**: one message per packet, at most [`MAX_MESSAGE`] bytes; a malformed, oversized
//!   or unexpected message closes the connection and nothing in it is acted on.
//! - **Never blocking**: sends are non-blocking and raise no SIGPIPE; a coordinator that stops
//!   reading loses its answers, not this process's time.
//! - **Falling back**: a closed connection (a killed coordinator) is seen at once, the poll set
//!   reports the hang-up, and the reclaimer tries to reconnect a second later. A coordinator
//!   that sends nothing for three ping intervals (stopped, hung, or only starved of a CPU) no
//!   longer orders this process's purges; the link is kept, and its next ping takes the order
//!   back. Either way the reclaimer purges on its own again from the same tick on, exactly as
//!   without a coordinator. The link is dropped (and a new one tried) only after forty ping
//!   intervals of silence, and at least ten seconds: a coordinator busy purging for a moment
//!   on a loaded machine keeps its participants, and with them its global order (dropping
//!   them at three intervals left it ordering only what the others still connected held).
//! - **Room**: [`super::make_room`] (a client's guard before it maps more memory) does not
//!   purge this process's data while the coordinator is live: it hands a `Room` request to
//!   this thread ([`ask_room`]), which sends it; the coordinator purges in the global order and
//!   answers `Roomed`. No answer while the coordinator stays live for forty ping intervals
//!   (its round waits for a participant that works at an older purge), or the link lost (or
//!   three ping intervals of silence), and the caller purges on its own.
//! - Shared regions: their descriptors are passed to the coordinator once each (at most
//!   16); every inventory lists the inodes still mapped, and the coordinator closes the others.
//!   The coordinator counts and purges the regions passed itself, once for every process that
//!   maps them, in the global order with everything else (it maps their headers and page
//!   tables); this process's inventory leaves them out and its obedience leaves them alone.
//!   Regions not passed (beyond the 16) are counted and purged here like private ranges.
//! - The descriptor is a guest's (`vrange_sys::fd::GuestFd`: above the floor, close-on-exec, verified
//!   before every use, closed in a fork child) and exists only while connected.

use super::victims;
use crate::coordination::{
    self, bucket_of, Inventory, Message, CLASSES, MAX_MESSAGE, MAX_SHARED, NAME_LEN,
};
use crate::managed;
use crate::order::{Cut, Place};
use crate::registry;
use crate::registry::pause;
use crate::stats;
use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::time::Duration;
use vrange_sys::clock::now_ns;
use vrange_sys::fd::{GuestFd, Ident};
use vrange_sys::lock::ForkOnce;
use vrange_sys::sock::{self, Recv};

/// How long to wait between connection attempts.
const RETRY_NS: u64 = 1_000_000_000;
/// A coordinator silent for this many ping intervals no longer orders this process's purges.
const SILENT_PINGS: u64 = 3;
/// A coordinator silent for this many ping intervals, and at least [`DROP_FLOOR_NS`], is taken
/// for gone: its link is dropped and a new one tried.
const DROP_PINGS: u64 = 40;
const DROP_FLOOR_NS: u64 = 10_000_000_000;
/// How long a `Room` request may wait for the coordinator's answer while the coordinator stays
/// live (its pings keep coming), in ping intervals: its round waits for the participants whose
/// data comes first, which on a busy machine may take seconds to purge; the coordinator waits
/// for one that works at it for thirty (`vrange-coordinator`'s `WORKING_PINGS`), so it answers
/// first. While the caller waits it maps nothing.
const ROOM_PINGS: u64 = 40;
/// Before the `Welcome`, the ping interval assumed.
const FIRST_PING_MS: u64 = 1000;

/// The ping interval (ms) of a live coordinator, 0 while none orders this process's purges,
/// and the process it was set in (a fork child has no link): what a caller of [`ask_room`]
/// (another thread) sees of the link.
static LIVE_PING_MS: AtomicU64 = AtomicU64::new(0);
static LIVE_PID: AtomicU32 = AtomicU32::new(0);

// A `Room` request, between the thread that asks ([`ask_room`]) and the reclaimer thread,
// which owns the link: a state word and its payload, all atomics (no lock a fork could leave
// held), owned by the process in `ASK_PID` (a fork child starts afresh).
const IDLE: u64 = 0;
/// `ASK_BYTES` wanted, not sent yet.
const WANTED: u64 = 1;
/// Sent with id `ASK_ID`.
const SENT: u64 = 2;
/// The coordinator answered: the cut of its round is in `ASK_CUT`.
const ANSWERED: u64 = 3;
/// The link was lost: the asker purges on its own.
const GONE: u64 = 4;
static ASK_STATE: AtomicU64 = AtomicU64::new(IDLE);
static ASK_BYTES: AtomicU64 = AtomicU64::new(0);
static ASK_ID: AtomicU64 = AtomicU64::new(0);
static ASK_CUT: AtomicU64 = AtomicU64::new(NO_CUT);
static ASK_PID: AtomicU32 = AtomicU32::new(0);
/// Bumped at every change an asker waits for (a futex word).
static ASK_SEQ: AtomicU32 = AtomicU32::new(0);

/// `ASK_CUT` when the coordinator saw nothing volatile.
const NO_CUT: u64 = u64::MAX;

fn encode_cut(cut: Option<(u8, u64)>) -> u64 {
    cut.map_or(NO_CUT, |(class, age)| {
        (u64::from(class) << 56) | age.min((1 << 56) - 1)
    })
}

fn decode_cut(word: u64) -> Option<(u8, u64)> {
    (word != NO_CUT).then_some(((word >> 56) as u8, word & ((1 << 56) - 1)))
}

fn ask_changed() {
    ASK_SEQ.fetch_add(1, Release);
    vrange_sys::futex::wake_all(&ASK_SEQ);
}

/// Moves the request from `from` to `to` if it is there; wakes the askers if it moved.
fn ask_moves(from: u64, to: u64) -> bool {
    let moved = ASK_STATE
        .compare_exchange(from, to, AcqRel, Acquire)
        .is_ok();
    if moved {
        ask_changed();
    }
    moved
}

/// The `Room` request waiting or sent, if any, will not be answered (no live coordinator):
/// its asker purges on its own.
fn room_unanswered() {
    if !ask_moves(WANTED, GONE) {
        ask_moves(SENT, GONE);
    }
}

/// Whether a live coordinator orders this process's purges (seen from any thread).
pub(super) fn live() -> bool {
    LIVE_PING_MS.load(Relaxed) != 0 && LIVE_PID.load(Relaxed) == std::process::id()
}

/// What came of [`ask_room`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Room {
    /// The coordinator ran a round for it: its cut (`None`: it saw nothing volatile).
    Answered(Option<(u8, u64)>),
    /// Another thread's request was in flight and is over: look at the headroom again.
    Waited,
    /// No live coordinator answered in time: purge on your own.
    NoAnswer,
}

/// Asks the live coordinator for `bytes` of room, in the caller's thread: hands the request to
/// the reclaimer thread (woken by `wake`) and waits for the answer while the coordinator stays
/// live, at most [`ROOM_PINGS`] ping intervals. One request at a time: a caller that finds one
/// in flight waits for it to end. The reclaimer thread itself never asks (it would wait for
/// its own answer).
pub(super) fn ask_room(bytes: u64, wake: fn()) -> Room {
    let ping_ms = LIVE_PING_MS.load(Relaxed);
    if !live() || std::thread::current().name() == Some(super::THREAD_NAME) {
        return Room::NoAnswer;
    }
    let pid = std::process::id();
    if ASK_PID.swap(pid, AcqRel) != pid {
        // A fork child: the parent's request in flight is not this process's.
        ASK_STATE.store(IDLE, Release);
    }
    let wait = Duration::from_millis(ROOM_PINGS.saturating_mul(ping_ms));
    let deadline = std::time::Instant::now() + wait;
    ASK_BYTES.store(bytes, Relaxed);
    let mine = ask_moves(IDLE, WANTED);
    if mine {
        wake();
    }
    loop {
        let seq = ASK_SEQ.load(Acquire);
        let state = ASK_STATE.load(Acquire);
        match (mine, state) {
            (false, IDLE) => return Room::Waited,
            (true, ANSWERED) => {
                let cut = decode_cut(ASK_CUT.load(Acquire));
                ask_moves(ANSWERED, IDLE);
                return Room::Answered(cut);
            }
            (true, GONE) => {
                ask_moves(GONE, IDLE);
                return Room::NoAnswer;
            }
            _ => {}
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() || !live() {
            // Withdrawn, unless the answer came meanwhile (a late answer finds the request
            // gone and is ignored).
            if mine && !ask_moves(state, IDLE) {
                continue;
            }
            return Room::NoAnswer;
        }
        vrange_sys::futex::wait(&ASK_SEQ, seq, left);
    }
}

/// The sockets to try, read from `VRANGE_COORDINATOR` once.
fn sockets() -> &'static [PathBuf] {
    static PATHS: ForkOnce<Vec<PathBuf>> = ForkOnce::new();
    PATHS.get_or_init(|| {
        use std::os::unix::ffi::OsStrExt;
        const NAME: &str = "VRANGE_COORDINATOR";
        match vrange_sys::settings::var(NAME) {
            None | Some(b"") => {
                coordination::default_sockets(vrange_sys::statsdir::effective_uid()).to_vec()
            }
            Some(b"off") => Vec::new(),
            Some(v) if v.first() == Some(&b'/') => {
                vec![PathBuf::from(std::ffi::OsStr::from_bytes(v))]
            }
            Some(v) => {
                vrange_sys::settings::warn(NAME, v, "an absolute path or off", &"off");
                Vec::new()
            }
        }
    })
}

/// A connection to a coordinator, held by the reclaimer thread.
pub(super) struct Link {
    sock: GuestFd,
    /// The ping interval the coordinator announced (ms).
    ping_ms: u64,
    welcomed: bool,
    /// When the coordinator last sent anything.
    heard: u64,
    /// Inodes of the shared regions passed on this connection.
    passed: Vec<u64>,
    /// The id of the last `Room` request sent.
    room_id: u64,
}

/// What the reclaimer thread keeps between ticks.
#[derive(Default)]
pub(super) struct Participant {
    link: Option<Link>,
    next_try: u64,
}

impl Participant {
    /// Whether a live coordinator orders this process's pressure purges now.
    pub fn coordinated(&self, now: u64) -> bool {
        self.link.as_ref().is_some_and(|l| {
            l.welcomed && now.saturating_sub(l.heard) < SILENT_PINGS * l.ping_ms * 1_000_000
        })
    }

    /// The socket, for the thread's poll set.
    pub fn ident(&self) -> Option<Ident> {
        self.link.as_ref().map(|l| l.sock.ident())
    }

    /// Connects if there is no link and a coordinator's socket exists (at most once a second).
    /// Returns whether a new link was made (the caller adds it to its poll set).
    pub fn connect(&mut self, now: u64) -> bool {
        if self.link.is_some() || now < self.next_try {
            return false;
        }
        self.next_try = now + RETRY_NS;
        for path in sockets() {
            // A missing socket is the common case: a stat, no descriptor.
            if std::fs::symlink_metadata(path).is_err() {
                continue;
            }
            if let Some(link) = open(path, now) {
                stats::count_coordinator_connection();
                self.link = Some(link);
                return true;
            }
        }
        false
    }

    /// Drops the link (its descriptor is closed only if it verifies); a `Room` request waiting
    /// for it is answered `Gone`.
    pub fn disconnect(&mut self) {
        // Uncoordinated before the socket closes: whoever sees the close sees the state after.
        stats::set_coordinated(false);
        LIVE_PING_MS.store(0, Relaxed);
        self.link = None;
        room_unanswered();
    }

    /// Reads and answers every message waiting; drops the link on anything wrong, or when the
    /// coordinator has been silent too long. Call on each tick.
    pub fn serve(&mut self, now: u64) {
        let Some(link) = self.link.as_mut() else {
            return;
        };
        let ok = link.serve() && link.send_room();
        let gone_after = DROP_PINGS
            .saturating_mul(link.ping_ms.max(1))
            .saturating_mul(1_000_000)
            .max(DROP_FLOOR_NS);
        let gone = now.saturating_sub(link.heard) >= gone_after;
        if !ok || gone {
            self.disconnect();
        } else {
            let coordinated = self.coordinated(now);
            stats::set_coordinated(coordinated);
            let ping_ms = self.link.as_ref().map_or(0, |l| l.ping_ms.max(1));
            LIVE_PID.store(std::process::id(), Relaxed);
            LIVE_PING_MS.store(if coordinated { ping_ms } else { 0 }, Relaxed);
            if !coordinated {
                room_unanswered();
            }
        }
    }
}

fn open(path: &std::path::Path, now: u64) -> Option<Link> {
    let sock = sock::connect(path).ok()?;
    let me = vrange_sys::statsdir::effective_uid();
    let peer = sock::peer_cred(sock.get()?).ok()?;
    if peer.uid != me && peer.uid != 0 {
        return None;
    }
    let link = Link {
        sock,
        ping_ms: FIRST_PING_MS,
        welcomed: false,
        heard: now,
        passed: Vec::new(),
        room_id: 0,
    };
    let hello = Message::Hello {
        pid: std::process::id(),
        name: program_name(),
    };
    link.send(&hello).then_some(link)
}

/// This program's name as `/proc/self/comm` shows it (NUL-padded).
fn program_name() -> [u8; NAME_LEN] {
    let mut name = [0u8; NAME_LEN];
    if let Ok(comm) = vrange_sys::procfs::comm(None) {
        for (d, s) in name.iter_mut().zip(comm.bytes()) {
            *d = s;
        }
    }
    name
}

impl Link {
    /// Sends one message; `false` if the connection is broken. A full queue (the coordinator
    /// is not reading) drops the message and keeps the link: silence ends it later.
    fn send(&self, m: &Message) -> bool {
        let mut buf = [0u8; MAX_MESSAGE];
        let n = m.encode(&mut buf);
        match self.sock.get() {
            Some(fd) => sock::send(fd, &buf[..n]).is_ok(),
            None => false,
        }
    }

    /// Sends the `Room` request waiting, if any. `false`: the link is broken.
    fn send_room(&mut self) -> bool {
        if !self.welcomed
            || ASK_STATE.load(Acquire) != WANTED
            || ASK_PID.load(Acquire) != std::process::id()
        {
            return true;
        }
        self.room_id = self.room_id.wrapping_add(1);
        ASK_ID.store(self.room_id, Release);
        let m = Message::Room {
            id: self.room_id,
            bytes: ASK_BYTES.load(Relaxed),
        };
        let sent = self.send(&m);
        // Unless the asker withdrew meanwhile.
        ask_moves(WANTED, if sent { SENT } else { GONE });
        sent
    }

    /// Handles every message waiting. `false`: drop the link.
    fn serve(&mut self) -> bool {
        let mut buf = [0u8; MAX_MESSAGE];
        loop {
            let Some(fd) = self.sock.get() else {
                return false;
            };
            let n = match sock::recv(fd, &mut buf) {
                Ok(Recv::Message(n)) => n,
                Ok(Recv::Empty) => return true,
                _ => return false,
            };
            let reply = match Message::decode(&buf[..n]) {
                Ok(Message::Welcome { ping_ms }) if !self.welcomed => {
                    self.welcomed = true;
                    self.ping_ms = u64::from(ping_ms);
                    None
                }
                Ok(Message::Ping { seq }) if self.welcomed => {
                    let shared = self.share();
                    Some(inventory(seq, shared))
                }
                Ok(Message::Purge {
                    id,
                    class,
                    min_age_ms,
                    cold_ms,
                }) if self.welcomed => {
                    let (ranges, bytes, youngest_ms) =
                        obey(class, min_age_ms, cold_ms, &self.passed);
                    let done = Message::Purged {
                        id,
                        bytes,
                        ranges,
                        youngest_ms,
                    };
                    if !self.send(&done) {
                        return false;
                    }
                    let shared = self.share();
                    Some(inventory(0, shared))
                }
                Ok(Message::Roomed { id, cut }) if self.welcomed => {
                    // An answer to a request withdrawn (the asker gave up) is ignored.
                    if ASK_STATE.load(Acquire) == SENT && ASK_ID.load(Acquire) == id {
                        ASK_CUT.store(encode_cut(cut), Release);
                        ask_moves(SENT, ANSWERED);
                    }
                    None
                }
                _ => return false,
            };
            self.heard = now_ns();
            if let Some(m) = reply {
                if !self.send(&m) {
                    return false;
                }
            }
        }
    }
}

impl Link {
    /// Passes the shared regions not passed yet on this connection (their descriptors, with
    /// `Share`), at most [`MAX_SHARED`]; returns the inodes of those passed and mapped now.
    fn share(&mut self) -> [u64; MAX_SHARED] {
        let mut live = [0u64; MAX_SHARED];
        let mut n = 0;
        let mut buf = [0u8; MAX_MESSAGE];
        // Freeing a shared region takes the purge lock: under it, each slot's descriptor lives.
        let p = pause();
        registry::for_each_live(|_, slot| {
            if slot.header().is_none() || n == MAX_SHARED {
                return;
            }
            // SAFETY: under the purge lock a shared region cannot be freed, so the box the slot
            // points to (its descriptor) lives until the lock is released.
            let Some(guest) = (unsafe { slot.fd.load(Relaxed).as_ref() }) else {
                return;
            };
            let ino = guest.ident().ino();
            if !self.passed.contains(&ino) {
                let m = Message::Share {
                    class: (slot.priority() as u8).min(CLASSES as u8 - 1),
                    len: slot.len.load(Relaxed) as u64,
                    ino,
                };
                let len = m.encode(&mut buf);
                // The thread's own table holds no copy of the region's memfd: it opens one.
                if let (Some(sock), Some(fd)) = (self.sock.get(), guest.for_this_thread()) {
                    if matches!(sock::send_fd(sock, &buf[..len], fd.as_fd()), Ok(true)) {
                        self.passed.push(ino);
                    }
                }
            }
            // Only a region the coordinator holds is its to count and purge.
            if self.passed.contains(&ino) {
                live[n] = ino;
                n += 1;
            }
        });
        drop(p);
        live
    }
}

/// This process's inventory now: volatile bytes by class and age, and its totals. One pass over
/// the registry. The shared regions the coordinator holds (`shared`: their inodes) are its to
/// count.
fn inventory(seq: u64, shared: [u64; MAX_SHARED]) -> Message {
    let now = now_ns();
    let mut inv = Box::new(Inventory {
        seq,
        shared,
        ..Inventory::default()
    });
    // Shared regions' pages live in their mappings: read under the purge lock (see
    // `registry::Slot::header`).
    let page = crate::page_size() as u64;
    let p = pause();
    registry::for_each_live(|_, slot| {
        let class = (slot.priority() as usize).min(CLASSES - 1);
        if let Some(h) = slot.header() {
            let ino = slot.shared_ino();
            if ino == 0 || !shared.contains(&ino) {
                h.volatile_runs(|_, n, used| {
                    let age_ms = now.saturating_sub(used) / 1_000_000;
                    inv.volatile[class][bucket_of(age_ms)] += n as u64 * page;
                });
            }
            return;
        }
        let word = slot.state().load();
        if managed::purgeable(slot, word) {
            let age_ms = now.saturating_sub(slot.last_used()) / 1_000_000;
            inv.volatile[class][bucket_of(age_ms)] += slot.len.load(Relaxed) as u64;
        }
    });
    drop(p);
    let s = stats::stats();
    inv.pinned = s.pinned_bytes;
    inv.purged = s.purged_bytes;
    inv.purged_total = s.purged_total_bytes;
    inv.obeyed = s.coordinator.requests;
    inv.freed_for_coordinator = s.coordinator.bytes;
    Message::Inventory(inv)
}

/// Purges everything before the coordinator's cut (`class`, `min_age_ms`) of the global order
/// (`crate::order::Cut`): every volatile range of a lower class, and those of `class` volatile
/// for at least `min_age_ms`, of those only ranges volatile for at least `cold_ms` (a proactive
/// step's floor), except the shared regions passed to the coordinator (`passed`: their inodes),
/// which it purges itself. Returns (ranges, bytes, age in ms of the youngest range purged).
fn obey(class: u8, min_age_ms: u64, cold_ms: u64, passed: &[u64]) -> (u64, u64, u64) {
    let cut = Cut::after(Place::new(class, min_age_ms)).scaled(1_000_000);
    let cold = cold_ms.saturating_mul(1_000_000);
    let victims = super::purge::candidates(u64::MAX);
    let now = now_ns();
    let chosen: Vec<victims::Candidate> = victims
        .into_iter()
        .filter(|c| {
            let place = c.place(now);
            cut.admits(place) && place.idle >= cold && (c.ino == 0 || !passed.contains(&c.ino))
        })
        .collect();
    let youngest = chosen.iter().map(|c| c.last_used).max();
    let p = pause();
    let (ranges, bytes) = victims::purge_oldest(&chosen, u64::MAX);
    drop(p);
    stats::record_coordinated(ranges, bytes);
    let youngest_ms = youngest.map_or(0, |t| now.saturating_sub(t) / 1_000_000);
    (ranges, bytes, youngest_ms)
}
