//! The coordinator's loop: one thread, one poll(2) over the listening socket, every connection
//! and the scope's pressure sources. Nothing here waits for a participant: requests are sent
//! without blocking and answered whenever the participant answers; one that does not answer
//! within the request timeout is marked unresponsive and left out of the plan until it speaks
//! again.

use crate::metrics::{self, Refusal, REFUSALS};
use crate::plan::{self, Cut};
use crate::proactive::{Controller, Decision, Reading};
use crate::scope::{Event, Scope, Watch};
use crate::{Options, Shared};
use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};
use vrange::coordination::{
    bucket_of, Inventory, Message, Row, SharedHandle, Status, BUCKETS, CLASSES, MAX_MESSAGE,
    MAX_SHARED, NAME_LEN,
};
use vrange_sys::cgroup::MemCgroup;
use vrange_sys::sock::{self, PeerCred, Recv};

enum Role {
    /// Connected, said nothing yet.
    Pending,
    Participant,
}

/// One connection.
struct Conn {
    fd: OwnedFd,
    cred: PeerCred,
    role: Role,
    name: [u8; NAME_LEN],
    inventory: Option<Box<Inventory>>,
    /// When the inventory came.
    received: Instant,
    heard: Instant,
    /// The purge request waiting for an answer.
    pending: Option<Request>,
    /// A purge to ask for as soon as `pending` is answered (one request at a time per
    /// participant): a round planned while this one was busy reached further into its data.
    next: Option<Request>,
    responsive: bool,
    ping_seq: u64,
    /// Shared regions it passed, with their class.
    shared: Vec<(SharedHandle, u8)>,
    /// Bytes the coordinator purged itself from those (a region several participants passed
    /// is credited to the first).
    freed_directly: u64,
    /// Its memory cgroup's directory (empty if unknown): a metrics label that survives a
    /// restart, unlike the pid.
    cgroup: String,
    /// Its `Room` request waiting for an answer.
    room: Option<RoomAsk>,
    /// Its CPU time (clock ticks) when its pending request was sent, if it could be read.
    cpu_at_ask: Option<u64>,
    /// Purged bytes it had taken back (reused or freed) at the proactive mode's last look.
    reused_seen: Option<u64>,
}

/// How long a participant that keeps working (its CPU time grows) may take to answer a purge
/// request before plans leave it out, in ping intervals: a purge of a few hundred MiB under
/// emulation on a busy machine took seconds. Fewer than a participant waits for a room
/// (`vrange::reclaim::participant`'s forty), so that its room is answered first.
const WORKING_PINGS: u32 = 30;

/// Whether a request open for `age` has waited too long: `patience`, or `cap` if the
/// participant is `working` at it (asked only past `patience`).
fn waited_too_long(
    age: Duration,
    patience: Duration,
    cap: Duration,
    working: impl FnOnce() -> bool,
) -> bool {
    age >= cap || (age >= patience && !working())
}

/// A process's CPU time in clock ticks (user and system), if its stat can be read (a
/// participant in another pid namespace cannot).
fn cpu_ticks(pid: i32) -> Option<u64> {
    let s = vrange_sys::procfs::stat(Some(u32::try_from(pid).ok()?)).ok()?;
    Some(s.utime_ticks.saturating_add(s.stime_ticks))
}

/// A participant's `Room` request: it is about to map memory and asks that the room come from
/// the global order rather than from its own data. Answered once the purge requests sent for
/// it have freed as much, or are all answered (or left to participants that do not answer).
#[derive(Debug, Clone)]
struct RoomAsk {
    id: u64,
    bytes: u64,
    /// `None` until a round is planned for it; then the round's cut (`None` inside: nothing
    /// was volatile).
    planned: Option<Option<Cut>>,
    /// The purge requests sent for it and not answered yet.
    requests: Vec<u64>,
    /// Bytes their answers reported freed.
    freed: u64,
}

impl Conn {
    fn send(&self, m: &Message) -> io::Result<bool> {
        let mut buf = [0u8; MAX_MESSAGE];
        let n = m.encode(&mut buf);
        sock::send(self.fd.as_fd(), &buf[..n])
    }

    /// Whether its open request has waited `patience` or longer while it did not work at it: a
    /// participant that may be stopped or hung, whose data a room round cannot count on now
    /// (until its request times out it stays in the plans of ordinary rounds). One that works
    /// (its CPU time grows: purging, under emulation or on a busy machine, takes seconds) is
    /// waited for up to `cap`.
    fn late(&self, patience: Duration, cap: Duration) -> bool {
        self.pending
            .is_some_and(|r| waited_too_long(r.sent.elapsed(), patience, cap, || self.working()))
    }

    /// Whether its CPU time grew since its pending request was sent.
    fn working(&self) -> bool {
        self.pending.is_some()
            && self
                .cpu_at_ask
                .is_some_and(|then| cpu_ticks(self.cred.pid).is_some_and(|now| now > then))
    }

    /// Sends purge request `r`; `false` if the participant cannot be told.
    fn ask(&mut self, r: Request) -> bool {
        let m = Message::Purge {
            id: r.id,
            class: r.cut.at.class,
            min_age_ms: r.cut.at.min_idle,
            cold_ms: r.cut.floor_ms,
        };
        let told = matches!(self.send(&m), Ok(true));
        if told {
            self.pending = Some(r);
            self.cpu_at_ask = cpu_ticks(self.cred.pid);
        }
        told
    }

    fn row(&self, now: Instant) -> Row {
        let inv = self.inventory.as_deref();
        Row {
            pid: self.cred.pid.max(0) as u32,
            uid: self.cred.uid,
            name: self.name,
            volatile: inv.map_or(0, Inventory::volatile_total),
            pinned: inv.map_or(0, |i| i.pinned),
            purged: inv.map_or(0, |i| i.purged),
            obeyed: inv.map_or(0, |i| i.obeyed),
            freed: inv.map_or(0, |i| i.freed_for_coordinator) + self.freed_directly,
            quiet_ms: now.duration_since(self.heard).as_millis() as u64,
            responsive: u8::from(self.responsive),
        }
    }
}

/// A purge request: its id, when it was sent (or planned), and how far it reaches.
#[derive(Debug, Clone, Copy)]
struct Request {
    id: u64,
    sent: Instant,
    cut: Cut,
}

/// A purge round in flight: from the pressure seen to the last answer.
struct Round {
    started: Instant,
    cut: Cut,
}

/// Whether a process may participate: it lives in the coordinated cgroup (or below it), so
/// that its pressure is pressure this coordinator watches. A process elsewhere that left its
/// pressure to this coordinator would be left unprotected; refused, it purges on its own. Any
/// process may participate in a machine-wide coordinator.
fn in_scope(scope: &Scope, cgroup: Option<&MemCgroup>, theirs: Option<&MemCgroup>) -> bool {
    match (scope, cgroup) {
        (Scope::Machine, _) => true,
        (Scope::Cgroup(_), Some(cg)) => theirs.is_some_and(|theirs| cg.contains(theirs)),
        (Scope::Cgroup(_), None) => false,
    }
}

pub(crate) struct Server<'a> {
    opts: &'a Options,
    shared: &'a Shared,
    listener: OwnedFd,
    watch: Watch,
    conns: Vec<Conn>,
    next_id: u64,
    round: Option<Round>,
    last_ping: Instant,
    me: u32,
    status: Status,
    refused: Refused,
    /// Purge requests answered since the last look: (request id, bytes freed).
    answered: Vec<(u64, u64)>,
    /// The proactive mode, if on.
    proactive: Option<Controller>,
    /// Pressure events since the proactive mode's last look.
    events_since_look: u64,
}

/// Connections refused or dropped, by [`Refusal`].
#[derive(Default)]
struct Refused([u64; REFUSALS]);

impl Refused {
    fn count(&mut self, why: Refusal) {
        self.0[why as usize] += 1;
    }

    fn total(&self) -> u64 {
        self.0.iter().sum()
    }
}

impl<'a> Server<'a> {
    pub fn new(opts: &'a Options, shared: &'a Shared, listener: OwnedFd, watch: Watch) -> Self {
        shared.lock().with_pid = opts.metrics_pid;
        let proactive = opts.proactive.map(|p| {
            let stall_file = vrange_sys::pressure::stall_file(watch.cgroup.as_ref());
            Controller::new(p, stall_file, Instant::now())
        });
        Server {
            opts,
            shared,
            listener,
            watch,
            conns: Vec::new(),
            next_id: 1,
            round: None,
            last_ping: Instant::now(),
            // SAFETY: geteuid cannot fail.
            me: unsafe { libc::geteuid() },
            status: Status {
                proactive: u64::from(opts.proactive.is_some()),
                ..Status::default()
            },
            refused: Refused::default(),
            answered: Vec::new(),
            proactive,
            events_since_look: 0,
        }
    }

    /// Runs until `shared.stop` is set.
    pub fn run(&mut self) -> io::Result<()> {
        let mut next_tick = Instant::now();
        while !self.shared.stop.load(Relaxed) {
            let wait = next_tick.saturating_duration_since(Instant::now());
            let mut events = self.poll(wait)?;
            let now = Instant::now();
            if now >= next_tick {
                next_tick = now + self.opts.interval;
                events.push(None);
            }
            if !events.is_empty() {
                self.tick(&events, now);
            }
        }
        Ok(())
    }

    /// One poll over everything; handles connections, returns the pressure events (and `None`
    /// entries for nothing in particular).
    fn poll(&mut self, wait: Duration) -> io::Result<Vec<Option<Event>>> {
        let sources = self.watch.fds();
        let mut fds = Vec::with_capacity(1 + sources.len() + self.conns.len());
        fds.push(sock::poll_in(self.listener.as_raw_fd()));
        for (fd, _) in &sources {
            let mut p = sock::poll_in(*fd);
            if self.watch.is_psi(*fd) {
                p.events = libc::POLLPRI;
            }
            fds.push(p);
        }
        fds.extend(self.conns.iter().map(|c| sock::poll_in(c.fd.as_raw_fd())));
        let ms = wait.as_millis().min(i32::MAX as u128) as i32;
        sock::poll(&mut fds, ms)?;
        let mut events = Vec::new();
        for (p, (fd, ev)) in fds[1..].iter().zip(&sources) {
            if p.revents != 0 {
                self.watch.drain(*fd);
                events.push(Some(*ev));
            }
        }
        let ready: Vec<bool> = fds[1 + sources.len()..]
            .iter()
            .map(sock::poll_ready)
            .collect();
        // From the last: a swap_remove only moves a connection already served.
        for i in (0..ready.len()).rev() {
            if ready[i] && !self.serve(i) {
                self.conns.swap_remove(i);
                events.push(None);
            }
        }
        // The last answer ends a round at once, not at the next tick.
        self.close_round();
        // A participant waiting for room is answered once its requests freed what it asked,
        // not only when the last participant asked answered (one may be slow: stopped).
        self.answer_rooms();
        // A participant waits for room: plan at once.
        if self
            .conns
            .iter()
            .any(|c| c.room.as_ref().is_some_and(|r| r.planned.is_none()))
        {
            events.push(None);
        }
        if sock::poll_ready(&fds[0]) {
            self.accept_all();
        }
        Ok(events)
    }

    fn accept_all(&mut self) {
        while let Ok(Some(fd)) = sock::accept(self.listener.as_fd()) {
            let Ok(cred) = sock::peer_cred(fd.as_fd()) else {
                continue;
            };
            if !self.authorized(&cred) {
                self.refused.count(Refusal::OtherUser);
                continue;
            }
            self.conns.push(Conn {
                fd,
                cred,
                role: Role::Pending,
                name: [0; NAME_LEN],
                inventory: None,
                received: Instant::now(),
                heard: Instant::now(),
                pending: None,
                next: None,
                responsive: true,
                ping_seq: 0,
                shared: Vec::new(),
                freed_directly: 0,
                cgroup: String::new(),
                room: None,
                cpu_at_ask: None,
                reused_seen: None,
            });
        }
    }

    /// Who may connect at all (to participate or to watch): the same user, or anyone when the
    /// coordinator runs as root.
    fn authorized(&self, cred: &PeerCred) -> bool {
        cred.uid == self.me || self.me == 0
    }

    /// Reads every message waiting on connection `i`; `false` drops it (closed, malformed,
    /// unexpected).
    fn serve(&mut self, i: usize) -> bool {
        let mut buf = [0u8; MAX_MESSAGE];
        loop {
            let c = &mut self.conns[i];
            let (n, passed) = match sock::recv_fd(c.fd.as_fd(), &mut buf) {
                Ok((Recv::Message(n), fd)) => (n, fd),
                Ok((Recv::Empty, _)) => return true,
                Ok((Recv::Closed, _)) => return false,
                Ok((Recv::TooLong, _)) | Err(_) => {
                    self.refused.count(Refusal::Protocol);
                    return false;
                }
            };
            c.heard = Instant::now();
            let ok = match (&c.role, Message::decode(&buf[..n])) {
                (Role::Pending, Ok(Message::Hello { name, .. })) => {
                    let theirs = u32::try_from(c.cred.pid)
                        .ok()
                        .filter(|&pid| pid > 0)
                        .and_then(MemCgroup::of_process);
                    if !in_scope(
                        &self.opts.scope,
                        self.watch.cgroup.as_ref(),
                        theirs.as_ref(),
                    ) {
                        self.refused.count(Refusal::OtherCgroup);
                        return false;
                    }
                    c.cgroup =
                        theirs.map_or_else(String::new, |cg| cg.path().display().to_string());
                    c.role = Role::Participant;
                    c.name = name;
                    let ping_ms = self.opts.ping.as_millis().clamp(1, u32::MAX as u128) as u32;
                    c.send(&Message::Welcome { ping_ms }).is_ok()
                        && c.send(&Message::Ping { seq: 0 }).is_ok()
                }
                (Role::Pending, Ok(Message::Monitor)) => {
                    self.answer_monitor(i);
                    return false;
                }
                (Role::Participant, Ok(Message::Share { class, ino, .. })) => {
                    // A descriptor that is not the region named, or one too many: refused.
                    let handle = passed.and_then(|fd| SharedHandle::open(fd).ok());
                    match handle {
                        Some(h) if h.ino() == ino && c.shared.len() < MAX_SHARED => {
                            c.shared.push((h, class));
                            true
                        }
                        _ => {
                            self.refused.count(Refusal::Descriptor);
                            false
                        }
                    }
                }
                (Role::Participant, Ok(Message::Inventory(inv))) => {
                    // Regions it no longer maps are let go, so their memory is not kept.
                    c.shared.retain(|(h, _)| inv.shared.contains(&h.ino()));
                    c.inventory = Some(inv);
                    c.received = Instant::now();
                    c.responsive = true;
                    true
                }
                (Role::Participant, Ok(Message::Room { id, bytes })) => {
                    // One at a time per participant: a new one replaces the last.
                    c.room = Some(RoomAsk {
                        id,
                        bytes,
                        planned: None,
                        requests: Vec::new(),
                        freed: 0,
                    });
                    self.shared.room_asked();
                    true
                }
                (Role::Participant, Ok(Message::Purged { id, bytes, .. })) => {
                    // A late answer (after the timeout) still counts; an id never sent is
                    // ignored: it asks nothing of the coordinator.
                    if c.pending.is_some_and(|r| r.id == id) {
                        c.pending = None;
                        c.responsive = true;
                        self.status.freed += bytes;
                        self.answered.push((id, bytes));
                        if let Some(p) = self.proactive.as_mut() {
                            p.answered(id, bytes);
                        }
                        // A further purge planned while this one ran goes now.
                        if let Some(mut r) = c.next.take() {
                            r.sent = Instant::now();
                            if c.ask(r) {
                                self.status.requests += 1;
                            } else {
                                c.responsive = false;
                            }
                        }
                    }
                    true
                }
                _ => {
                    self.refused.count(Refusal::Protocol);
                    false
                }
            };
            if !ok {
                return false;
            }
        }
    }

    fn answer_monitor(&mut self, i: usize) {
        let now = Instant::now();
        let mut status = self.status;
        status.refused = self.refused.total();
        status.participants = self.participants().count() as u64;
        let mut msgs = vec![Message::Status(status)];
        msgs.extend(
            self.participants()
                .map(|c| Message::Row(Box::new(c.row(now)))),
        );
        msgs.extend(
            self.regions()
                .into_iter()
                .map(|(h, _, participants)| Message::SharedRow(h.census(participants))),
        );
        msgs.push(Message::End);
        let c = &self.conns[i];
        for m in &msgs {
            if !matches!(c.send(m), Ok(true)) {
                break;
            }
        }
    }

    fn participants(&self) -> impl Iterator<Item = &Conn> {
        self.conns
            .iter()
            .filter(|c| matches!(c.role, Role::Participant))
    }

    /// The shared regions the participants passed, each once however many passed it: its
    /// handle, the highest class a participant gave it (the one that values it most decides
    /// where it stands in the order) and how many passed it.
    fn regions(&self) -> Vec<(&SharedHandle, u8, u32)> {
        let mut out: Vec<(&SharedHandle, u8, u32)> = Vec::new();
        for (h, class) in self.participants().flat_map(|c| &c.shared) {
            match out.iter_mut().find(|(o, _, _)| o.ino() == h.ino()) {
                Some(e) => {
                    e.1 = e.1.max(*class);
                    e.2 += 1;
                }
                None => out.push((h, *class, 1)),
            }
        }
        out
    }

    /// Pings, times out requests, reads the pressure and plans a round.
    fn tick(&mut self, events: &[Option<Event>], now: Instant) {
        if now.duration_since(self.last_ping) >= self.opts.ping {
            self.last_ping = now;
            let mut dead = Vec::new();
            for (i, c) in self.conns.iter_mut().enumerate() {
                if matches!(c.role, Role::Participant) {
                    c.ping_seq += 1;
                    if c.send(&Message::Ping { seq: c.ping_seq }).is_err() {
                        dead.push(i);
                    }
                } else if now.duration_since(c.heard) > self.opts.request_timeout {
                    // Connected and silent: not a participant.
                    dead.push(i);
                }
            }
            for i in dead.into_iter().rev() {
                self.conns.swap_remove(i);
            }
            // Holders of the shared regions whose process died: their pins released, as each
            // process mapping the region does once per tick of its own.
            for (h, _, _) in self.regions() {
                h.reap();
            }
        }
        let cap = self.working_cap();
        for c in &mut self.conns {
            let late = c.late(self.opts.request_timeout, cap);
            // Pings unanswered as long: stopped or hung (not purging for us: the reclaimer
            // thread answers pings after its purge).
            let silent = now.duration_since(c.heard) > self.opts.request_timeout + self.opts.ping
                && !(c.working() && now.duration_since(c.heard) < cap);
            if late || (silent && matches!(c.role, Role::Participant)) {
                // Left out of plans until it speaks again; a request stays open.
                c.responsive = false;
            }
        }
        self.close_round();
        let (headroom, ceiling) = self.watch.headroom().unwrap_or((u64::MAX, 0));
        self.status.headroom = if ceiling == 0 { 0 } else { headroom };
        self.status.limit = ceiling;
        let threshold = self
            .opts
            .headroom
            .unwrap_or_else(|| vrange::short::auto_threshold(ceiling));
        let mut target = if ceiling == 0 {
            0
        } else {
            vrange::short::deficit(headroom, threshold)
        };
        // Room asked by participants about to map memory (each computed from the same usage:
        // the largest, not the sum; one still short asks again).
        let asked = self
            .conns
            .iter()
            .filter_map(|c| c.room.as_ref().filter(|r| r.planned.is_none()))
            .map(|r| r.bytes)
            .max()
            .unwrap_or(0);
        let merged = self.merged(None);
        let volatile: u64 = merged.iter().flatten().sum();
        // A vmpressure event asks only while memory is short (`vrange::short::vmpressure_purges`).
        let short = vrange::short::vmpressure_purges((ceiling != 0).then_some(headroom), threshold);
        for e in events.iter().flatten() {
            self.shared.event(*e);
            self.events_since_look += 1;
            target = target.max(match e {
                Event::Critical | Event::Medium if !short => 0,
                Event::Critical => volatile,
                Event::Psi | Event::Medium => (volatile / 4).max(2 << 20),
            });
        }
        self.status.refused = self.refused.total();
        if let Some(p) = &self.proactive {
            self.status.proactive_saved = p.report.saved;
            self.status.proactive_target = p.report.target;
            self.status.proactive_stalls = p.report.stalls;
            self.shared.proactive(Some(p.report));
        }
        self.shared
            .publish(&self.status, self.metrics_rows(now), self.watch.oom_kills());
        self.shared.refused(self.refused.0);
        if self.round.is_none() && target.max(asked) > 0 {
            let cut = plan::cut(&merged, target.max(asked));
            let (cut, ids, direct) = self.send_round(cut, now, None);
            match cut {
                Some(cut) if !ids.is_empty() => self.round = Some(Round { started: now, cut }),
                // Only shared regions, purged by the coordinator itself: over already.
                Some(cut) if direct > 0 => self.shared.round_done(now.elapsed(), cut),
                _ => {}
            }
            self.plan_rooms(cut, ids, direct);
        } else if asked > 0 {
            // Room wanted during a round: a round of its own over the same order. Those busy
            // with the round's request keep their place in it (what they hold before the new
            // cut is asked of them as soon as they answer), unless their request has waited
            // as long as a room may (they may be stopped): the room comes from the others.
            let patience = self.room_patience();
            let free = self.merged(Some(patience));
            let cut = plan::cut(&free, asked);
            let (cut, ids, direct) = self.send_round(cut, now, Some(patience));
            self.plan_rooms(cut, ids, direct);
        } else if self.round.is_none() {
            // Nothing short, nothing asked: memory back before anyone asks, if on.
            self.proactive_look(&merged, now);
        }
        self.answer_rooms();
    }

    /// The proactive mode's look, when due: reads the stall, the events and the refaults
    /// since the last, and takes a step if they are quiet (`crate::proactive`).
    fn proactive_look(&mut self, merged: &[[u64; BUCKETS]; CLASSES], now: Instant) {
        let Some(mut p) = self.proactive.take() else {
            return;
        };
        if p.due(now) {
            let mut refaulted = 0u64;
            for c in self.conns.iter_mut() {
                let Some(inv) = c.inventory.as_deref() else {
                    continue;
                };
                let reused = inv.purged_total.saturating_sub(inv.purged);
                let seen = c.reused_seen.replace(reused).unwrap_or(reused);
                refaulted = refaulted.saturating_add(reused.saturating_sub(seen));
            }
            let reading = Reading {
                usage: self.watch.usage().unwrap_or(0),
                stall_pct: p.stall(now),
                events: std::mem::take(&mut self.events_since_look),
                refaulted,
            };
            if let Decision::Step(bytes) = p.decide(now, &reading) {
                let min_idle = p.settings.min_idle.as_millis() as u64;
                let cut = plan::cold_cut(merged, bytes, min_idle);
                let (cut, ids, direct) = self.send_round(cut, now, None);
                // What the volatile memory cannot give, from the kernel's page cache (v2).
                let rest = bytes.saturating_sub(cut.map_or(0, |c| c.bytes));
                let reclaimed = match &self.watch.cgroup {
                    Some(cg) if rest > 0 && cg.reclaim(rest).is_ok() => rest,
                    _ => 0,
                };
                p.stepped(now, ids, direct.saturating_add(reclaimed));
            }
        }
        self.proactive = Some(p);
    }

    /// How long a `Room` request waits for the purges planned for it from a participant that
    /// does not work at them: two ping intervals.
    fn room_patience(&self) -> Duration {
        self.opts.ping.saturating_mul(2)
    }

    /// How long a participant that works at a purge request is waited for: [`WORKING_PINGS`]
    /// ping intervals, and at least the request timeout.
    fn working_cap(&self) -> Duration {
        self.opts
            .ping
            .saturating_mul(WORKING_PINGS)
            .max(self.opts.request_timeout)
    }

    /// Every inventory aged by the time since it came (so that all share one clock), of the
    /// participants that answer (less those whose open request is older than `late`, if
    /// given), and the shared regions passed (each once, read now: the coordinator purges
    /// those itself), merged.
    fn merged(&self, late: Option<Duration>) -> [[u64; BUCKETS]; CLASSES] {
        let live: Vec<Inventory> = self
            .participants()
            .filter(|c| c.responsive && !late.is_some_and(|p| c.late(p, self.working_cap())))
            .filter_map(|c| Some(plan::aged(c.inventory.as_deref()?, c.received.elapsed())))
            .collect();
        let mut shared = Inventory::default();
        for (h, class, _) in self.regions() {
            h.volatile(|bytes, idle| {
                shared.volatile[class as usize][bucket_of(idle.as_millis() as u64)] += bytes;
            });
        }
        plan::merge(live.iter().chain([&shared]))
    }

    /// Purges the runs of the shared regions passed that come before `cut` (of the global order:
    /// `plan::cut`, or `plan::cold_cut` for a proactive step), and asks every participant that answers to purge what
    /// it holds before the cut: at once if it has no request open, else when it answers
    /// (unless the open one reaches as far); those whose open request is older than `late`, if
    /// given, are not asked. Returns the cut (`None`: nothing to cut), the ids of the
    /// requests that will free that data, and the bytes purged from shared regions.
    fn send_round(
        &mut self,
        cut: Option<Cut>,
        now: Instant,
        late: Option<Duration>,
    ) -> (Option<Cut>, Vec<u64>, u64) {
        let Some(cut) = cut else {
            return (None, Vec::new(), 0);
        };
        self.status.rounds += 1;
        let cap = self.working_cap();
        // Each region once, at its class in the order, credited to the first who passed it.
        let mut todo: Vec<(u64, u8)> = self
            .regions()
            .into_iter()
            .map(|(h, class, _)| (h.ino(), class))
            .collect();
        let mut direct = 0;
        for c in self.conns.iter_mut() {
            for (h, _) in &c.shared {
                let Some(at) = todo.iter().position(|(ino, _)| *ino == h.ino()) else {
                    continue;
                };
                let (_, class) = todo.swap_remove(at);
                let n = h.purge_before(|idle| cut.admits(class, idle.as_millis() as u64));
                c.freed_directly += n;
                direct += n;
            }
        }
        self.status.freed += direct;
        let mut sent = Vec::new();
        for c in self.conns.iter_mut() {
            let holds = c.responsive
                && !late.is_some_and(|p| c.late(p, cap))
                && matches!(c.role, Role::Participant)
                && c.inventory
                    .as_deref()
                    .is_some_and(|i| plan::before(&plan::aged(i, c.received.elapsed()), &cut) > 0);
            if !holds {
                continue;
            }
            // A request open or queued that reaches this far frees it already.
            if let Some(r) = [c.next, c.pending]
                .into_iter()
                .flatten()
                .find(|r| r.cut.covers(&cut))
            {
                sent.push(r.id);
                continue;
            }
            let r = Request {
                id: self.next_id,
                sent: now,
                cut,
            };
            self.next_id += 1;
            sent.push(r.id);
            if c.pending.is_some() {
                c.next = Some(r);
            } else if c.ask(r) {
                self.status.requests += 1;
            } else {
                c.responsive = false;
                sent.pop();
            }
        }
        (Some(cut), sent, direct)
    }

    /// The `Room` requests not planned yet wait for `requests`, under `cut`, with the `direct`
    /// bytes the round purged from shared regions already freed.
    fn plan_rooms(&mut self, cut: Option<Cut>, requests: Vec<u64>, direct: u64) {
        for r in self.conns.iter_mut().filter_map(|c| c.room.as_mut()) {
            if r.planned.is_none() {
                r.planned = Some(cut);
                r.requests.clone_from(&requests);
                r.freed = r.freed.saturating_add(direct);
            }
        }
    }

    /// Credits the answers that came to the `Room` requests they were sent for, and answers
    /// each planned one whose requests freed what it asked, or are all answered or left to
    /// participants that do not answer (or have not for two ping intervals without working
    /// at them, or for [`WORKING_PINGS`] while working: the participant waiting gives up after
    /// forty, and asked again, it gets a round over the others).
    fn answer_rooms(&mut self) {
        let answered = std::mem::take(&mut self.answered);
        let (patience, cap) = (self.room_patience(), self.working_cap());
        let open: Vec<u64> = self
            .conns
            .iter()
            .filter(|c| c.responsive)
            .flat_map(|c| {
                [c.pending, c.next].into_iter().flatten().filter(move |r| {
                    !waited_too_long(r.sent.elapsed(), patience, cap, || c.working())
                })
            })
            .map(|r| r.id)
            .collect();
        for c in &mut self.conns {
            let Some(r) = c.room.as_mut() else {
                continue;
            };
            for (id, bytes) in &answered {
                if let Some(at) = r.requests.iter().position(|x| x == id) {
                    r.requests.swap_remove(at);
                    r.freed = r.freed.saturating_add(*bytes);
                }
            }
            let Some(cut) = r.planned else {
                continue;
            };
            if r.freed < r.bytes && r.requests.iter().any(|id| open.contains(id)) {
                continue;
            }
            let m = Message::Roomed {
                id: r.id,
                cut: cut.map(|k| (k.at.class, k.at.min_idle)),
            };
            c.room = None;
            if !matches!(c.send(&m), Ok(true)) {
                c.responsive = false;
            }
        }
    }

    /// Ends the round in flight once every participant asked has answered or timed out.
    fn close_round(&mut self) {
        if let Some(r) = &self.round {
            if self
                .conns
                .iter()
                .all(|c| c.pending.is_none() || !c.responsive)
            {
                self.shared.round_done(r.started.elapsed(), r.cut);
                self.round = None;
            }
        }
    }

    fn metrics_rows(&self, now: Instant) -> Vec<metrics::Participant> {
        self.participants()
            .map(|c| metrics::Participant {
                row: c.row(now),
                cgroup: c.cgroup.clone(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_participant_working_at_its_request_is_waited_for_up_to_the_cap() {
        let ms = Duration::from_millis;
        let (patience, cap) = (ms(500), ms(7500));
        let never = || -> bool { panic!("working asked before patience ran out") };
        assert!(!waited_too_long(ms(499), patience, cap, never));
        assert!(waited_too_long(ms(500), patience, cap, || false), "stopped");
        assert!(
            !waited_too_long(ms(3000), patience, cap, || true),
            "working"
        );
        assert!(
            waited_too_long(ms(7500), patience, cap, || true),
            "past the cap"
        );
    }

    #[test]
    fn this_process_cpu_time_grows_while_it_works() {
        let pid = std::process::id() as i32;
        let before = cpu_ticks(pid).expect("own stat");
        let t = Instant::now();
        let mut x = 1u64;
        while t.elapsed() < Duration::from_millis(100) {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
        assert!(cpu_ticks(pid).expect("own stat") > before, "{x}");
        assert_eq!(cpu_ticks(i32::MAX), None, "no such process");
    }
}
