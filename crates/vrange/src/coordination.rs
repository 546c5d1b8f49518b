//! The coordinator protocol: what a process using vrange and a coordinator (`vrange daemon`)
//! say to each other over a UNIX sequenced-packet socket. Every message is one packet of a
//! fixed length per kind, little-endian, at most [`MAX_MESSAGE`] bytes, starting with the
//! 4-byte magic `VRC1` and a kind byte (then three zero bytes). Anything else (a wrong length,
//! magic, kind or padding, a class out of range) is [`Malformed`]: the receiver drops the
//! connection and acts on nothing from it.
//!
//! | message | from → to | when | body |
//! |---|---|---|---|
//! | `Hello` | participant → coordinator | on connecting | pid, program name (16 bytes) |
//! | `Welcome` | coordinator → participant | answer to `Hello` | ping interval (ms) |
//! | `Ping` | coordinator → participant | every interval | sequence number |
//! | `Inventory` | participant → coordinator | answer to `Ping` and after each purge | volatile bytes by class and age bucket; pinned, purged, obeyed |
//! | `Purge` | coordinator → participant | pressure | request id, class `P`, age `A` |
//! | `Purged` | participant → coordinator | answer to `Purge` | bytes and ranges freed, the youngest age purged |
//! | `Share` + descriptor | participant → coordinator | a shared region it has not passed yet | class, length, inode |
//! | `Room` | participant → coordinator | before it maps more memory, its headroom short | request id, bytes wanted |
//! | `Roomed` | coordinator → participant | the round planned for a `Room` is over | request id, the cut (class `P`, age `A`) if any |
//! | `Monitor` | `vrange top` → coordinator | on connecting | none |
//! | `Status`, `Row`…, `SharedRow`…, `End` | coordinator → monitor | answer to `Monitor` | totals; one row per participant; one per shared region it holds |
//!
//! A purge request names a point in the one global order (lowest class first, then oldest):
//! the participant purges every volatile range of a class below `P`, and those of class `P`
//! volatile for at least `A` milliseconds: everything before the point, nothing after.
//! Inventories are never per-range lists: [`CLASSES`] × [`BUCKETS`] byte counts, the buckets
//! growing by √2 from 100 ms ([`bucket_of`], [`bucket_floor_ms`]).
//!
//! Room: a participant about to map more memory (vrange-cache before a slab) whose cgroup's
//! headroom would fall short does not purge its own data while a coordinator is live: it asks
//! with `Room`, the coordinator purges at least that many bytes in the global order (a round
//! like any other), and answers `Roomed` with the cut once the round is over; the participant
//! may then purge on its own only what comes before that cut. No answer while the coordinator
//! stays live for forty ping intervals (the coordinator waits up to thirty for a participant
//! that works at a purge: its CPU time grows), or a closed connection, and it purges on its own
//! as without a coordinator.
//!
//! Shared regions: a participant passes each of its shared regions' descriptors once
//! (SCM_RIGHTS, at most [`MAX_SHARED`]), and lists the inodes it still maps in every inventory,
//! whose volatile bytes leave those regions out. The coordinator maps only their headers and
//! page tables ([`SharedHandle`]), counts each region once however many participants map it
//! (the runs of pages volatile in every process, by how long ago they became volatile, at the
//! highest class a participant gave it), and purges the runs that come before the cut itself
//! (holes punched for every process, by the same state machine every process uses), in the
//! one global order with the participants' private memory: that works while a participant is
//! stopped or hung, too. It releases the pins of holders whose process died, as every process
//! mapping a region does. It closes a descriptor when no inventory lists its inode any more or
//! the participant disconnects, so it never keeps a freed region's memory alive for long.
//!
//! Liveness: a participant purges on its own again (as without a coordinator) when the socket
//! closes, or while no message came for three ping intervals (a stopped, hung or starved
//! coordinator: the link stays, and the next ping gives the order back). It drops the link
//! after forty silent intervals (at least ten seconds) and reconnects when it can.

use std::fmt;
use std::path::PathBuf;

/// The largest message either side accepts.
pub const MAX_MESSAGE: usize = 2048;
/// Priority classes (`Priority::DropFirst` = 0 … `Priority::DropLast` = 3).
pub const CLASSES: usize = 4;
/// Age buckets of an inventory.
pub const BUCKETS: usize = 40;
/// Bytes of a program name in `Hello` and `Row` (NUL-padded, like `/proc/PID/comm`).
pub const NAME_LEN: usize = 16;
/// Shared regions a participant passes to the coordinator at most.
pub const MAX_SHARED: usize = 16;

const MAGIC: [u8; 4] = *b"VRC1";
const HEADER: usize = 8;

/// The lower bound of age bucket `k` in milliseconds: 0, then 100 ms × √2^(k−1).
pub fn bucket_floor_ms(k: usize) -> u64 {
    if k == 0 {
        0
    } else {
        let half = (k - 1) as u32;
        let whole = 100u64 << (half / 2);
        if half % 2 == 0 {
            whole
        } else {
            // × √2 to within 0.01 %.
            whole * 14_142 / 10_000
        }
    }
}

/// The bucket of an age in milliseconds.
pub fn bucket_of(age_ms: u64) -> usize {
    (1..BUCKETS)
        .rev()
        .find(|&k| age_ms >= bucket_floor_ms(k))
        .unwrap_or(0)
}

/// Volatile bytes by class and age bucket, and the participant's totals.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inventory {
    /// Echo of the `Ping` answered (0: sent after a purge).
    pub seq: u64,
    /// `volatile[class][bucket]`: bytes the participant would purge, by how long ago their
    /// range became volatile.
    pub volatile: [[u64; BUCKETS]; CLASSES],
    /// Bytes of managed memory in use (pinned).
    pub pinned: u64,
    /// Bytes of purged ranges not yet reused.
    pub purged: u64,
    /// Bytes purged since the process started, by any source.
    pub purged_total: u64,
    /// Purge requests obeyed.
    pub obeyed: u64,
    /// Bytes freed for those requests.
    pub freed_for_coordinator: u64,
    /// Inodes of the shared regions passed with `Share` that the participant still maps (0:
    /// none).
    pub shared: [u64; MAX_SHARED],
}

impl Default for Inventory {
    fn default() -> Inventory {
        Inventory {
            seq: 0,
            volatile: [[0; BUCKETS]; CLASSES],
            pinned: 0,
            purged: 0,
            purged_total: 0,
            obeyed: 0,
            freed_for_coordinator: 0,
            shared: [0; MAX_SHARED],
        }
    }
}

impl Inventory {
    /// Volatile bytes in all classes and buckets.
    pub fn volatile_total(&self) -> u64 {
        self.volatile.iter().flatten().sum()
    }
}

/// One participant as the coordinator shows it to a monitor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// Its pid.
    pub pid: u32,
    /// Its effective uid.
    pub uid: u32,
    /// Its program name (NUL-padded).
    pub name: [u8; NAME_LEN],
    /// Volatile bytes now.
    pub volatile: u64,
    /// Pinned bytes now.
    pub pinned: u64,
    /// Purged bytes not yet reused.
    pub purged: u64,
    /// Purge requests obeyed.
    pub obeyed: u64,
    /// Bytes freed for the coordinator.
    pub freed: u64,
    /// Milliseconds since its last message.
    pub quiet_ms: u64,
    /// Whether it answers (0: no, a request timed out; 1: yes).
    pub responsive: u8,
}

/// One shared region as the coordinator shows it to a monitor (bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SharedRow {
    /// Its file's inode.
    pub ino: u64,
    /// Bytes of data.
    pub len: u64,
    /// Volatile in every process (no holder pins them), resident.
    pub volatile: u64,
    /// Pinned by some holder.
    pub pinned: u64,
    /// Purged and not pinned since.
    pub purged: u64,
    /// Holders (mappings, in any process) with a number now.
    pub holders: u32,
    /// Participants that passed it to the coordinator.
    pub participants: u32,
}

/// The coordinator's totals, first in its answer to a monitor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Status {
    /// Participants connected.
    pub participants: u64,
    /// Pressure events answered with purge requests.
    pub rounds: u64,
    /// Purge requests sent.
    pub requests: u64,
    /// Bytes the participants reported freed.
    pub freed: u64,
    /// Headroom of the coordinated cgroup or machine when last read (bytes).
    pub headroom: u64,
    /// Its limit (bytes; 0: none).
    pub limit: u64,
    /// Connections dropped for malformed messages or refused credentials.
    pub refused: u64,
    /// The proactive mode (`vrange daemon --proactive`): 1 on, 0 off; bytes it freed, the usage
    /// it aims for, and its looks that held for a stall.
    pub proactive: u64,
    pub proactive_saved: u64,
    pub proactive_target: u64,
    pub proactive_stalls: u64,
}

/// A message of the protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Message {
    Hello {
        pid: u32,
        name: [u8; NAME_LEN],
    },
    Welcome {
        ping_ms: u32,
    },
    Ping {
        seq: u64,
    },
    Inventory(Box<Inventory>),
    /// Purge what comes before the cut (`class`, `min_age_ms`) of the global order, and of
    /// that only what has been volatile for at least `cold_ms` (0: no such floor; a proactive
    /// step's, which must never take young memory of a lower class).
    Purge {
        id: u64,
        class: u8,
        min_age_ms: u64,
        cold_ms: u64,
    },
    Purged {
        id: u64,
        bytes: u64,
        ranges: u64,
        youngest_ms: u64,
    },
    Share {
        class: u8,
        len: u64,
        ino: u64,
    },
    Room {
        id: u64,
        bytes: u64,
    },
    Roomed {
        id: u64,
        /// The cut of the round, `None` if nothing was volatile.
        cut: Option<(u8, u64)>,
    },
    Monitor,
    Status(Status),
    Row(Box<Row>),
    SharedRow(SharedRow),
    End,
}

/// A message that does not parse: wrong length, magic, kind, padding or value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed;

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("malformed coordinator message")
    }
}

impl std::error::Error for Malformed {}

const INVENTORY_LEN: usize = 8 + CLASSES * BUCKETS * 8 + 5 * 8 + MAX_SHARED * 8;
const ROW_LEN: usize = 4 + 4 + NAME_LEN + 6 * 8 + 8;
const SHARED_ROW_LEN: usize = 5 * 8 + 2 * 4;
const _: () = assert!(HEADER + INVENTORY_LEN <= MAX_MESSAGE);

impl Message {
    fn kind(&self) -> u8 {
        match self {
            Message::Hello { .. } => 1,
            Message::Welcome { .. } => 2,
            Message::Ping { .. } => 3,
            Message::Inventory(_) => 4,
            Message::Purge { .. } => 5,
            Message::Purged { .. } => 6,
            Message::Monitor => 7,
            Message::Status(_) => 8,
            Message::Row(_) => 9,
            Message::End => 10,
            Message::Share { .. } => 11,
            Message::Room { .. } => 12,
            Message::Roomed { .. } => 13,
            Message::SharedRow(_) => 14,
        }
    }

    /// The body length of each kind (`None`: no such kind).
    fn body_len(kind: u8) -> Option<usize> {
        Some(match kind {
            1 => 4 + NAME_LEN,
            2 => 8,
            3 => 8,
            4 => INVENTORY_LEN,
            5 => 32,
            6 => 32,
            7 | 10 => 0,
            8 => 11 * 8,
            9 => ROW_LEN,
            11 => 24,
            12 => 16,
            13 => 24,
            14 => SHARED_ROW_LEN,
            _ => return None,
        })
    }

    /// Writes the message into `buf` and returns its length.
    pub fn encode(&self, buf: &mut [u8; MAX_MESSAGE]) -> usize {
        let mut w = Writer { buf, at: 0 };
        w.bytes(&MAGIC);
        w.bytes(&[self.kind(), 0, 0, 0]);
        match self {
            Message::Hello { pid, name } => {
                w.u32(*pid);
                w.bytes(name);
            }
            Message::Welcome { ping_ms } => {
                w.u32(*ping_ms);
                w.u32(0);
            }
            Message::Ping { seq } => w.u64(*seq),
            Message::Inventory(inv) => {
                w.u64(inv.seq);
                for v in inv.volatile.iter().flatten() {
                    w.u64(*v);
                }
                for v in [
                    inv.pinned,
                    inv.purged,
                    inv.purged_total,
                    inv.obeyed,
                    inv.freed_for_coordinator,
                ] {
                    w.u64(v);
                }
                for v in inv.shared {
                    w.u64(v);
                }
            }
            Message::Share { class, len, ino } => {
                w.bytes(&[*class, 0, 0, 0, 0, 0, 0, 0]);
                w.u64(*len);
                w.u64(*ino);
            }
            Message::Room { id, bytes } => {
                w.u64(*id);
                w.u64(*bytes);
            }
            Message::Roomed { id, cut } => {
                w.u64(*id);
                let (class, age) = cut.unwrap_or((0, 0));
                w.bytes(&[class, u8::from(cut.is_some()), 0, 0, 0, 0, 0, 0]);
                w.u64(age);
            }
            Message::Purge {
                id,
                class,
                min_age_ms,
                cold_ms,
            } => {
                w.u64(*id);
                w.bytes(&[*class, 0, 0, 0, 0, 0, 0, 0]);
                w.u64(*min_age_ms);
                w.u64(*cold_ms);
            }
            Message::Purged {
                id,
                bytes,
                ranges,
                youngest_ms,
            } => {
                for v in [*id, *bytes, *ranges, *youngest_ms] {
                    w.u64(v);
                }
            }
            Message::SharedRow(r) => {
                for v in [r.ino, r.len, r.volatile, r.pinned, r.purged] {
                    w.u64(v);
                }
                w.u32(r.holders);
                w.u32(r.participants);
            }
            Message::Monitor | Message::End => {}
            Message::Status(s) => {
                for v in [
                    s.participants,
                    s.rounds,
                    s.requests,
                    s.freed,
                    s.headroom,
                    s.limit,
                    s.refused,
                    s.proactive,
                    s.proactive_saved,
                    s.proactive_target,
                    s.proactive_stalls,
                ] {
                    w.u64(v);
                }
            }
            Message::Row(r) => {
                w.u32(r.pid);
                w.u32(r.uid);
                w.bytes(&r.name);
                for v in [
                    r.volatile, r.pinned, r.purged, r.obeyed, r.freed, r.quiet_ms,
                ] {
                    w.u64(v);
                }
                w.bytes(&[r.responsive, 0, 0, 0, 0, 0, 0, 0]);
            }
        }
        w.at
    }

    /// Parses one whole message.
    ///
    /// # Errors
    /// [`Malformed`] for anything but exactly one message of a known kind.
    pub fn decode(msg: &[u8]) -> Result<Message, Malformed> {
        if msg.len() < HEADER || msg[..4] != MAGIC || msg[5..8] != [0, 0, 0] {
            return Err(Malformed);
        }
        let kind = msg[4];
        if Message::body_len(kind) != Some(msg.len() - HEADER) {
            return Err(Malformed);
        }
        let mut r = Reader {
            buf: &msg[HEADER..],
        };
        let m = match kind {
            1 => Message::Hello {
                pid: r.u32(),
                name: r.array(),
            },
            2 => {
                let ping_ms = r.u32();
                if r.u32() != 0 || ping_ms == 0 {
                    return Err(Malformed);
                }
                Message::Welcome { ping_ms }
            }
            3 => Message::Ping { seq: r.u64() },
            4 => {
                let mut inv = Box::<Inventory>::default();
                inv.seq = r.u64();
                for v in inv.volatile.iter_mut().flatten() {
                    *v = r.u64();
                }
                inv.pinned = r.u64();
                inv.purged = r.u64();
                inv.purged_total = r.u64();
                inv.obeyed = r.u64();
                inv.freed_for_coordinator = r.u64();
                for v in inv.shared.iter_mut() {
                    *v = r.u64();
                }
                Message::Inventory(inv)
            }
            11 => {
                let pad: [u8; 8] = r.array();
                if pad[1..] != [0; 7] || pad[0] as usize >= CLASSES {
                    return Err(Malformed);
                }
                Message::Share {
                    class: pad[0],
                    len: r.u64(),
                    ino: r.u64(),
                }
            }
            5 => {
                let id = r.u64();
                let pad: [u8; 8] = r.array();
                if pad[1..] != [0; 7] || pad[0] as usize >= CLASSES {
                    return Err(Malformed);
                }
                Message::Purge {
                    id,
                    class: pad[0],
                    min_age_ms: r.u64(),
                    cold_ms: r.u64(),
                }
            }
            12 => Message::Room {
                id: r.u64(),
                bytes: r.u64(),
            },
            13 => {
                let id = r.u64();
                let pad: [u8; 8] = r.array();
                let age = r.u64();
                let cut = match pad {
                    [class, 1, 0, 0, 0, 0, 0, 0] if (class as usize) < CLASSES => {
                        Some((class, age))
                    }
                    [0, 0, 0, 0, 0, 0, 0, 0] if age == 0 => None,
                    _ => return Err(Malformed),
                };
                Message::Roomed { id, cut }
            }
            6 => Message::Purged {
                id: r.u64(),
                bytes: r.u64(),
                ranges: r.u64(),
                youngest_ms: r.u64(),
            },
            7 => Message::Monitor,
            14 => {
                let v: [u64; 5] = std::array::from_fn(|_| r.u64());
                Message::SharedRow(SharedRow {
                    ino: v[0],
                    len: v[1],
                    volatile: v[2],
                    pinned: v[3],
                    purged: v[4],
                    holders: r.u32(),
                    participants: r.u32(),
                })
            }
            8 => Message::Status(Status {
                participants: r.u64(),
                rounds: r.u64(),
                requests: r.u64(),
                freed: r.u64(),
                headroom: r.u64(),
                limit: r.u64(),
                refused: r.u64(),
                proactive: r.u64(),
                proactive_saved: r.u64(),
                proactive_target: r.u64(),
                proactive_stalls: r.u64(),
            }),
            9 => {
                let (pid, uid, name) = (r.u32(), r.u32(), r.array());
                let vals: [u64; 6] = std::array::from_fn(|_| r.u64());
                let flag: [u8; 8] = r.array();
                if flag[1..] != [0; 7] || flag[0] > 1 {
                    return Err(Malformed);
                }
                Message::Row(Box::new(Row {
                    pid,
                    uid,
                    name,
                    volatile: vals[0],
                    pinned: vals[1],
                    purged: vals[2],
                    obeyed: vals[3],
                    freed: vals[4],
                    quiet_ms: vals[5],
                    responsive: flag[0],
                }))
            }
            _ => Message::End,
        };
        Ok(m)
    }
}

struct Writer<'a> {
    buf: &'a mut [u8; MAX_MESSAGE],
    at: usize,
}

impl Writer<'_> {
    fn bytes(&mut self, b: &[u8]) {
        self.buf[self.at..self.at + b.len()].copy_from_slice(b);
        self.at += b.len();
    }
    fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
}

/// Reads a body whose length was checked against its kind, so every read is in bounds.
struct Reader<'a> {
    buf: &'a [u8],
}

impl Reader<'_> {
    fn array<const N: usize>(&mut self) -> [u8; N] {
        let (head, rest) = self.buf.split_at(N);
        self.buf = rest;
        head.try_into().unwrap_or([0; N])
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }
}

/// A shared region a participant passed to the coordinator: its descriptor and its header
/// and page table, nothing of its data. [`SharedHandle::purge_before`] purges it as any
/// process's reclaimer would: only pages no process pins, in holes punched for all.
pub struct SharedHandle {
    page: crate::shared::HeaderPage,
    fd: std::os::fd::OwnedFd,
    ino: u64,
}

impl SharedHandle {
    /// Takes a descriptor received with `Share`; checks that it is a vrange shared region.
    ///
    /// # Errors
    /// [`Error::Unsupported`](crate::Error::Unsupported) for anything else; `Os` for a failed
    /// fstat or mmap.
    pub fn open(fd: std::os::fd::OwnedFd) -> Result<SharedHandle, crate::Error> {
        use std::os::fd::AsFd;
        use std::os::unix::fs::MetadataExt;
        let ino = std::fs::File::from(fd.try_clone().map_err(crate::Error::from)?)
            .metadata()
            .map_err(crate::Error::from)?
            .ino();
        let page = crate::shared::HeaderPage::open(fd.as_fd())?;
        Ok(SharedHandle { page, fd, ino })
    }

    /// The region's inode (as the participant's inventory lists it).
    pub fn ino(&self) -> u64 {
        self.ino
    }

    /// Bytes of data.
    pub fn len(&self) -> usize {
        self.page.header().len()
    }

    /// Whether it has no data (never: regions are at least a page).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Calls `f(bytes, idle)` for every run of pages volatile in every process that maps the
    /// region, with how long ago the run became volatile.
    pub fn volatile(&self, mut f: impl FnMut(u64, std::time::Duration)) {
        let page = crate::page_size() as u64;
        let now = vrange_sys::clock::now_ns();
        self.page.header().volatile_runs(|_, n, used| {
            f(
                n as u64 * page,
                std::time::Duration::from_nanos(now.saturating_sub(used)),
            )
        });
    }

    /// Its pages now, in bytes, and its holders; `participants` as given.
    pub fn census(&self, participants: u32) -> SharedRow {
        let h = self.page.header();
        let page = crate::page_size() as u64;
        let c = h.census(None, 0, h.pages().len());
        SharedRow {
            ino: self.ino,
            len: self.len() as u64,
            volatile: c.volatile * page,
            pinned: c.pinned * page,
            purged: c.purged * page,
            holders: h.holders() as u32,
            participants,
        }
    }

    /// Purges, for every process, each run of volatile pages that `before(idle)` places before
    /// the cut (`idle`: how long ago the run became volatile), if it is still volatile and
    /// unused since. Returns the bytes freed.
    pub fn purge_before(&self, before: impl Fn(std::time::Duration) -> bool) -> u64 {
        use std::os::fd::AsFd;
        let h = self.page.header();
        let page = crate::page_size();
        let now = vrange_sys::clock::now_ns();
        let mut runs = Vec::new();
        h.volatile_runs(|first, n, used| {
            if before(std::time::Duration::from_nanos(now.saturating_sub(used))) {
                runs.push((first, n, used));
            }
        });
        let offset = self.page.data_offset();
        let mut pages = 0;
        for (first, n, used) in runs {
            pages += h.purge_run(first, n, Some(used), |at, k| {
                // SAFETY: the pages are PURGING: no process holds them pinned, and none can
                // pin them until the purge finishes.
                unsafe {
                    vrange_sys::shm::punch_hole(self.fd.as_fd(), offset + at * page, k * page)
                }
            });
        }
        (pages * page) as u64
    }

    /// Releases the pins of the region's holders whose process is certainly gone
    /// (`vrange_sys::pid::is_gone`), as every process mapping it does once per tick. Reads
    /// `/proc`. Returns the holders released.
    pub fn reap(&self) -> usize {
        self.page
            .header()
            .reap_gone(&vrange_sys::pid::identity(), vrange_sys::clock::now_ns())
    }
}

impl fmt::Debug for SharedHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedHandle")
            .field("ino", &self.ino)
            .field("len", &self.len())
            .finish()
    }
}

/// Where a participant looks for a coordinator, in order, when `VRANGE_COORDINATOR` is unset:
/// the user's own (in the user's private statistics directory), then the system-wide one.
pub fn default_sockets(euid: u32) -> [PathBuf; 2] {
    [user_socket(euid), PathBuf::from(SYSTEM_SOCKET)]
}

/// The socket of a coordinator run by user `euid` (not root): in the user's private
/// directory, `/dev/shm/vrange-<euid>`, beside the statistics files.
pub fn user_socket(euid: u32) -> PathBuf {
    crate::publish::default_dir(euid).join("coordinator.sock")
}

/// The socket of a coordinator run by root.
pub const SYSTEM_SOCKET: &str = "/run/vrange/coordinator.sock";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_grow_by_root_two() {
        assert_eq!(bucket_floor_ms(0), 0);
        assert_eq!(bucket_floor_ms(1), 100);
        assert_eq!(bucket_floor_ms(2), 141);
        assert_eq!(bucket_floor_ms(3), 200);
        assert_eq!(bucket_floor_ms(21), 102_400);
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(99), 0);
        assert_eq!(bucket_of(100), 1);
        assert_eq!(bucket_of(199), 2);
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        for k in 1..BUCKETS {
            assert!(bucket_floor_ms(k) > bucket_floor_ms(k - 1));
            assert_eq!(bucket_of(bucket_floor_ms(k)), k);
        }
    }

    #[test]
    fn every_message_round_trips_and_damage_is_refused() {
        let mut inv = Inventory {
            seq: 9,
            pinned: 1,
            purged: 2,
            purged_total: 3,
            obeyed: 4,
            freed_for_coordinator: 5,
            ..Inventory::default()
        };
        inv.volatile[2][7] = 1 << 20;
        let all = [
            Message::Hello {
                pid: 7,
                name: *b"renderer\0\0\0\0\0\0\0\0",
            },
            Message::Welcome { ping_ms: 250 },
            Message::Ping { seq: 3 },
            Message::Inventory(Box::new(inv)),
            Message::Purge {
                id: 1,
                class: 3,
                min_age_ms: 1000,
                cold_ms: 500,
            },
            Message::Purged {
                id: 1,
                bytes: 2,
                ranges: 3,
                youngest_ms: 4,
            },
            Message::Monitor,
            Message::Status(Status {
                participants: 4,
                proactive: 1,
                proactive_stalls: 9,
                ..Status::default()
            }),
            Message::Row(Box::new(Row {
                pid: 1,
                uid: 2,
                name: [b'x'; NAME_LEN],
                volatile: 3,
                pinned: 4,
                purged: 5,
                obeyed: 6,
                freed: 7,
                quiet_ms: 8,
                responsive: 1,
            })),
            Message::End,
            Message::Share {
                class: 1,
                len: 4096,
                ino: 77,
            },
            Message::Room { id: 3, bytes: 5 },
            Message::Roomed {
                id: 3,
                cut: Some((2, 1414)),
            },
            Message::Roomed { id: 4, cut: None },
            Message::SharedRow(SharedRow {
                ino: 9,
                len: 8192,
                volatile: 4096,
                pinned: 4096,
                purged: 0,
                holders: 2,
                participants: 1,
            }),
        ];
        let mut buf = [0u8; MAX_MESSAGE];
        for m in all {
            let n = m.encode(&mut buf);
            assert_eq!(Message::decode(&buf[..n]), Ok(m.clone()));
            assert_eq!(Message::decode(&buf[..n - 1]), Err(Malformed), "{m:?}");
            let mut longer = buf[..n].to_vec();
            longer.push(0);
            assert_eq!(Message::decode(&longer), Err(Malformed), "{m:?}");
            let mut bad = buf[..n].to_vec();
            bad[0] ^= 1;
            assert_eq!(Message::decode(&bad), Err(Malformed));
        }
        let n = Message::Purge {
            id: 1,
            class: 0,
            min_age_ms: 0,
            cold_ms: 0,
        }
        .encode(&mut buf);
        buf[HEADER + 8] = CLASSES as u8;
        assert_eq!(Message::decode(&buf[..n]), Err(Malformed));
    }
}
