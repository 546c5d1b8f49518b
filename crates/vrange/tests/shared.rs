//! Shared volatile regions between two real processes: a pin held by either process keeps the
//! other's purges off the region, a purge by either frees the pages for both, and each learns
//! of a purge at its own next unmark, even after the other refilled the region.
//!
//! # Design
//! The test process creates a shared region (a memfd) and hands its descriptor to a *peer*, a
//! fresh execution of this test binary (see `vrange_testkit::role`), either by inheritance
//! (close-on-exec cleared on the child's copy only, the number in `VRANGE_TEST_FD`) or over a
//! UNIX socket with SCM_RIGHTS (an abstract address in `VRANGE_TEST_SOCKET`; the peer then
//! checks it inherited no such descriptor). The peer maps it with `open_shared` and obeys
//! line commands on stdin (`unmark SEED`, `check SEED`, `mark`, `purge`, `rss`, `exit`),
//! answering each with the counts it found: pages reading all zero, pages holding exactly
//! `fill`'s pattern for SEED, and others (corruption).
//!
//! Both processes start with every pressure source off (`VRANGE_PSI`, `VRANGE_VMPRESSURE`,
//! `VRANGE_HEADROOM`), so that only the explicit `vrange::purge` calls under test purge: a
//! system-wide PSI event caused by anything else on the machine would otherwise purge the
//! region at a moment the test does not control. The tests of this binary run one at a time:
//! a purge purges every volatile region of its process.

// Plays the program vrange is a guest in: closes, duplicates and inspects descriptors by
// number, which vrange's own code may only do through vrange_sys (clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::time::{Duration, Instant};
use vrange::{page_size, Options, Policy, Priority, VolatileRegion};
use vrange_sys::procfs;
use vrange_testkit::fork::{fork_linked, Forked, Link};
use vrange_testkit::pattern::{check_at, fill, fill_at, is_zero};
use vrange_testkit::proc::{inherit_fd, Exit};
use vrange_testkit::role::{command, role, role_command, say, Reply, Role};
use vrange_testkit::serial;

const MIB: usize = 1 << 20;
const SYNC: Duration = Duration::from_secs(20);

const PIN_TEST: &str = "pin_in_one_process_blocks_purge_by_the_other";
const SOCKET_TEST: &str = "pin_in_one_process_blocks_purge_by_the_other_fd_over_unix_socket";
const FREE_TEST: &str = "purge_by_other_process_frees_memory";

const PEER: &str = "peer";
const FD_ENV: &str = "VRANGE_TEST_FD";
const SOCKET_ENV: &str = "VRANGE_TEST_SOCKET";
/// The pressure sources both processes turn off.
const QUIET: [&str; 3] = ["VRANGE_PSI", "VRANGE_VMPRESSURE", "VRANGE_HEADROOM"];

/// Pages of `[ptr, ptr + len)` that read all zero, hold exactly `fill(ptr, len, seed)`'s
/// pattern, and neither.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Census {
    zero: u64,
    matching: u64,
    other: u64,
}

fn census(ptr: *const u8, len: usize, seed: u64) -> Census {
    census_at(ptr, 0, len / page_size(), seed)
}

/// [`census`] of pages `[first, first + n)` of the region at `base`, against what
/// `fill(base, _, seed)` writes there.
fn census_at(base: *const u8, first: usize, n: usize, seed: u64) -> Census {
    let page = page_size();
    let mut c = Census {
        zero: 0,
        matching: 0,
        other: 0,
    };
    for off in (first * page..(first + n) * page).step_by(page) {
        if is_zero(base.wrapping_add(off), page) {
            c.zero += 1;
        } else if check_at(base, off, page, seed) {
            c.matching += 1;
        } else {
            c.other += 1;
        }
    }
    c
}

fn quiet_reclaimer() {
    for name in QUIET {
        vrange::set_option(name, "off").expect("set_option");
    }
}

/// Descriptors of this process that are vrange shared-region memfds.
fn memfds() -> u64 {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return 0;
    };
    dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.to_string_lossy().starts_with("/memfd:vrange-shared"))
        .count() as u64
}

/// Sends `fd` over `sock` (SCM_RIGHTS), with one byte of data.
fn send_fd(sock: &UnixStream, fd: BorrowedFd<'_>) -> io::Result<()> {
    let mut byte = [b'F'];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // u64 for the alignment cmsghdr needs.
    let mut control = [0u64; 8];
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    assert!(space <= std::mem::size_of_val(&control));
    // SAFETY: an all-zero msghdr is valid; the pointers set below outlive the sendmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space;
    // SAFETY: msg's control buffer holds `space` bytes, enough for one header and one fd;
    // CMSG_DATA points inside it.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
        libc::CMSG_DATA(cmsg)
            .cast::<RawFd>()
            .write_unaligned(fd.as_raw_fd());
    }
    // SAFETY: msg is fully initialised and its buffers are live.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, 0) };
    if n == 1 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Receives one descriptor sent by [`send_fd`] (close-on-exec).
fn recv_fd(sock: &UnixStream) -> io::Result<OwnedFd> {
    let mut byte = [0u8];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut control = [0u64; 8];
    // SAFETY: an all-zero msghdr is valid; the pointers set below outlive the recvmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    // SAFETY: msg is fully initialised and its buffers are live and writable.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: recvmsg filled msg; the CMSG macros walk its control buffer within
    // msg_controllen.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let fd = libc::CMSG_DATA(cmsg).cast::<RawFd>().read_unaligned();
                return Ok(OwnedFd::from_raw_fd(fd));
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        format!(
            "no descriptor in the message ({n} bytes, flags {:#x})",
            msg.msg_flags
        ),
    ))
}

/// What one process's side of the concurrent lock and unlock test saw (see
/// [`chromium_lock_unlock_of_sub_ranges_from_two_processes_at_once`]).
#[derive(Debug, Default)]
struct Hammered {
    /// Pins (unmarks of a range).
    pins: u64,
    /// Pins that reported pages purged.
    purged: u64,
    /// Times its own pages were found purged and refilled.
    refills: u64,
    /// Broken promises, and the first one.
    violations: u64,
    first: String,
}

impl Hammered {
    fn violated(&mut self, what: String) {
        if self.violations == 0 {
            self.first = what;
        }
        self.violations += 1;
    }
}

/// For `time`, pins each of `ranges` (pages) of `r` in turn, as a renderer locks the spans it
/// draws (Chromium's `DiscardableSharedMemory::Lock(offset, length)`), checks it, uses it a
/// moment and unpins it again. Only this process writes its `own` pages (filled with `seed`
/// relative to the region's start); the ranges reach into the other process's pages too.
/// Checks, on its own pages: a pin that reports nothing purged finds them all intact; pages
/// found zero are among those reported purged; nothing is ever half written; and pages
/// stay intact while the range is pinned, whatever the purger does meanwhile.
fn hammer(
    r: &VolatileRegion,
    time: Duration,
    seed: u64,
    own: (usize, usize),
    ranges: &[(usize, usize)],
) -> Hammered {
    let page = page_size();
    let mut h = Hammered::default();
    let end = Instant::now() + time;
    while Instant::now() < end {
        for &(first, n) in ranges {
            let u = r
                .unmark_range(first * page, n * page)
                .expect("unmark_range");
            h.pins += 1;
            h.purged += u64::from(u.purged > 0);
            let lo = first.max(own.0);
            let hi = (first + n).min(own.0 + own.1);
            if lo < hi {
                let c = census_at(r.as_ptr(), lo, hi - lo, seed);
                if c.other > 0 {
                    h.violated(format!("pages {lo}..{hi} half written: {c:?}"));
                }
                if c.zero > u.purged as u64 {
                    h.violated(format!(
                        "pages {lo}..{hi}: {} zero, {} reported purged in {first}+{n}",
                        c.zero, u.purged
                    ));
                }
                if c.zero > 0 {
                    fill_at(r.as_ptr(), lo * page, (hi - lo) * page, seed);
                    h.refills += 1;
                }
                // In use a moment: a purge now must not touch the pinned pages.
                std::thread::yield_now();
                let c = census_at(r.as_ptr(), lo, hi - lo, seed);
                if c.matching != (hi - lo) as u64 {
                    h.violated(format!("pages {lo}..{hi} lost while pinned: {c:?}"));
                }
            }
            // SAFETY: no reference into the pages is held while they are volatile.
            unsafe { r.mark_range(first * page, n * page) }.expect("mark_range");
        }
    }
    h
}

// ---- The peer ----

/// The peer (see the module documentation).
fn peer() {
    let inherited = memfds();
    let fd = if let Ok(n) = std::env::var(FD_ENV) {
        let n: RawFd = n.parse().expect("descriptor number");
        // SAFETY: the test process kept this descriptor open across exec for us; nothing else
        // in this process owns it.
        unsafe { OwnedFd::from_raw_fd(n) }
    } else {
        let name = std::env::var(SOCKET_ENV).expect("VRANGE_TEST_FD or VRANGE_TEST_SOCKET");
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).expect("abstract address");
        let sock = UnixStream::connect_addr(&addr).expect("connect to the test process");
        recv_fd(&sock).expect("receive the region's descriptor")
    };
    let r = VolatileRegion::open_shared(fd.as_fd(), Priority::Normal).expect("open_shared");
    // open_shared duplicated it.
    drop(fd);
    say(format_args!(
        "OPENED len={} inherited_memfds={inherited} policy={:?}",
        r.len(),
        r.policy()
    ));
    let mut child: Option<(Forked, Link)> = None;
    while let Some(cmd) = command() {
        let mut words = cmd.split_whitespace();
        let verb = words.next().unwrap_or_default();
        let args: Vec<u64> = words.map(|w| w.parse().expect("a number")).collect();
        let arg = |i: usize| args[i];
        let page = page_size();
        match verb {
            "unmark" => {
                let u = r.unmark().expect("unmark");
                let c = census(r.as_ptr(), r.len(), arg(0));
                say(format_args!(
                    "UNMARKED pages={} volatile={} purged={} zero={} match={} other={}",
                    u.pages, u.volatile, u.purged, c.zero, c.matching, c.other
                ));
            }
            "check" => {
                let c = census(r.as_ptr(), r.len(), arg(0));
                say(format_args!(
                    "CHECKED zero={} match={} other={}",
                    c.zero, c.matching, c.other
                ));
            }
            "mark" => {
                // SAFETY: this process holds no reference into the region until it unmarks.
                unsafe { r.mark() }.expect("mark");
                say("MARKED");
            }
            "pin" => {
                let (first, n) = (arg(0) as usize, arg(1) as usize);
                let u = r
                    .unmark_range(first * page, n * page)
                    .expect("unmark_range");
                let c = census_at(r.as_ptr(), first, n, arg(2));
                say(format_args!(
                    "PINNED pages={} volatile={} purged={} zero={} match={} other={}",
                    u.pages, u.volatile, u.purged, c.zero, c.matching, c.other
                ));
            }
            "unpin" => {
                // SAFETY: this process holds no reference into those pages until it pins them.
                unsafe { r.mark_range(arg(0) as usize * page, arg(1) as usize * page) }
                    .expect("mark_range");
                say("UNPINNED");
            }
            "fill" => {
                let (first, n) = (arg(0) as usize, arg(1) as usize);
                fill_at(r.as_ptr(), first * page, n * page, arg(2));
                say("FILLED");
            }
            "look" => {
                let c = census_at(r.as_ptr(), arg(0) as usize, arg(1) as usize, arg(2));
                say(format_args!(
                    "LOOKED zero={} match={} other={}",
                    c.zero, c.matching, c.other
                ));
            }
            "hammer" => {
                // hammer MILLIS SEED OWN_FIRST OWN_PAGES (FIRST PAGES)...
                let ranges: Vec<(usize, usize)> = args[4..]
                    .chunks(2)
                    .map(|c| (c[0] as usize, c[1] as usize))
                    .collect();
                let h = hammer(
                    &r,
                    Duration::from_millis(arg(0)),
                    arg(1),
                    (arg(2) as usize, arg(3) as usize),
                    &ranges,
                );
                say(format_args!(
                    "HAMMERED pins={} purged={} refills={} violations={} first={}",
                    h.pins,
                    h.purged,
                    h.refills,
                    h.violations,
                    h.first.replace(' ', "_")
                ));
            }
            "spin" => {
                // Pins and unpins the pages for ever, until killed.
                let (at, len) = (arg(0) as usize * page, arg(1) as usize * page);
                say("SPINNING");
                loop {
                    r.unmark_range(at, len).expect("unmark_range");
                    // SAFETY: no reference into the pages is held while they are volatile.
                    unsafe { r.mark_range(at, len) }.expect("mark_range");
                }
            }
            "forkpin" => {
                // A fork child pins the pages, says what it found, and waits to be killed.
                let (first, n, seed) = (arg(0) as usize, arg(1) as usize, arg(2));
                let (forked, link) = fork_linked(|link| {
                    let Ok(u) = r.unmark_range(first * page, n * page) else {
                        return 1;
                    };
                    let c = census_at(r.as_ptr(), first, n, seed);
                    let words = [
                        u.pages as u64,
                        u.volatile as u64,
                        u.purged as u64,
                        c.zero,
                        c.matching,
                        c.other,
                    ];
                    if !link.send(&words) {
                        return 2;
                    }
                    let _ = link.recv::<1>(Duration::from_secs(600));
                    0
                });
                let w: [u64; 6] = link.recv(SYNC).expect("the fork child's report");
                say(format_args!(
                    "FORKPINNED child={} pages={} volatile={} purged={} zero={} match={} \
                     other={}",
                    forked.pid(),
                    w[0],
                    w[1],
                    w[2],
                    w[3],
                    w[4],
                    w[5]
                ));
                // The child waits on the link: it stays open until the child is killed.
                child = Some((forked, link));
            }
            "forkkill" => {
                let (mut forked, _link) = child.take().expect("a fork child");
                // SAFETY: the pid is this process's unreaped child.
                unsafe { libc::kill(forked.pid(), libc::SIGKILL) };
                let exit = forked.wait(SYNC);
                say(format_args!("FORKKILLED exit={}", exit.encode()));
            }
            "purge" => {
                let bytes = vrange::purge(usize::MAX);
                let e = *vrange::stats().source(vrange::Source::Explicit);
                say(format_args!(
                    "PURGED bytes={bytes} explicit_events={} explicit_bytes={} reaction_ns={}",
                    e.events, e.bytes, e.reaction_last_ns
                ));
            }
            "rss" => {
                let s = procfs::smaps_of(r.as_ptr() as usize)
                    .expect("smaps")
                    .expect("the region is mapped");
                say(format_args!("RSS kb={}", s.rss_kb));
            }
            "exit" => break,
            other => panic!("peer: unknown command {other:?}"),
        }
    }
    say(format_args!(
        "BYE losses={}",
        vrange::stats().losses_reported
    ));
}

fn play(role: &str) {
    match role {
        PEER => peer(),
        HOLDERS_ROLE => dead_holders(),
        other => panic!("unknown role {other:?}"),
    }
}

// ---- The test process ----

/// How the peer gets the region's descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    Inherit,
    Socket,
}

/// The peer process, with helpers for its commands.
struct Peer(Role);

impl Peer {
    /// Starts a peer for `test` and hands it `r`'s descriptor.
    fn start(test: &str, r: &VolatileRegion, pass: Pass) -> Peer {
        let fd = r.shared_fd().expect("a shared region has a descriptor");
        let mut cmd = role_command(test, PEER);
        for name in QUIET {
            cmd.env(name, "off");
        }
        let mut listener = None;
        match pass {
            Pass::Inherit => {
                inherit_fd(&mut cmd, fd.as_raw_fd());
                cmd.env(FD_ENV, fd.as_raw_fd().to_string());
            }
            Pass::Socket => {
                let name = vrange_sys::cgroup::unique_name("vrange-test-shared-");
                let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
                let l = UnixListener::bind_addr(&addr).expect("bind an abstract UNIX socket");
                l.set_nonblocking(true).unwrap();
                listener = Some(l);
                cmd.env(SOCKET_ENV, name);
            }
        }
        let mut role = Role::spawn("peer", cmd);
        if let Some(l) = listener {
            // Accept with a deadline: a peer that died before connecting must not hang us.
            let deadline = Instant::now() + SYNC;
            let sock = loop {
                match l.accept() {
                    Ok((sock, _)) => break sock,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        if Instant::now() > deadline {
                            let diagnostics = role.diagnostics();
                            panic!("the peer did not connect\n{diagnostics}");
                        }
                        std::thread::sleep(Duration::from_millis(2));
                    }
                    Err(e) => panic!("accept: {e}"),
                }
            };
            sock.set_nonblocking(false).unwrap();
            send_fd(&sock, fd).expect("send the descriptor with SCM_RIGHTS");
        }
        let opened = role.expect("OPENED", SYNC);
        assert_eq!(
            opened.u64("len"),
            r.len() as u64,
            "the peer maps the whole region"
        );
        assert_eq!(
            opened.str("policy"),
            "Managed",
            "shared regions are managed"
        );
        let inherited = opened.u64("inherited_memfds");
        match pass {
            Pass::Inherit => assert_eq!(inherited, 1, "the peer inherited the descriptor"),
            Pass::Socket => assert_eq!(
                inherited, 0,
                "the descriptor is close-on-exec: it reached the peer over the socket only"
            ),
        }
        Peer(role)
    }

    fn ask(&mut self, cmd: &str, tag: &str) -> Reply {
        assert!(self.0.send(cmd), "the peer stopped reading commands");
        self.0.expect(tag, SYNC)
    }

    /// Unmarks in the peer: (purged pages, census of the content for `seed`).
    fn unmark(&mut self, seed: u64) -> (u64, Census) {
        let r = self.ask(&format!("unmark {seed}"), "UNMARKED");
        assert_eq!(r.u64("pages"), r.u64("volatile"), "{r:?}");
        (
            r.u64("purged"),
            Census {
                zero: r.u64("zero"),
                matching: r.u64("match"),
                other: r.u64("other"),
            },
        )
    }

    fn check(&mut self, seed: u64) -> Census {
        let r = self.ask(&format!("check {seed}"), "CHECKED");
        Census {
            zero: r.u64("zero"),
            matching: r.u64("match"),
            other: r.u64("other"),
        }
    }

    fn mark(&mut self) {
        self.ask("mark", "MARKED");
    }

    /// Pins pages `[first, first + n)` in the peer: ((pages, volatile, purged), census of them
    /// for `seed`).
    fn pin(&mut self, first: usize, n: usize, seed: u64) -> ((u64, u64, u64), Census) {
        let r = self.ask(&format!("pin {first} {n} {seed}"), "PINNED");
        (
            (r.u64("pages"), r.u64("volatile"), r.u64("purged")),
            Census {
                zero: r.u64("zero"),
                matching: r.u64("match"),
                other: r.u64("other"),
            },
        )
    }

    fn unpin(&mut self, first: usize, n: usize) {
        self.ask(&format!("unpin {first} {n}"), "UNPINNED");
    }

    fn fill(&mut self, first: usize, n: usize, seed: u64) {
        self.ask(&format!("fill {first} {n} {seed}"), "FILLED");
    }

    fn look(&mut self, first: usize, n: usize, seed: u64) -> Census {
        let r = self.ask(&format!("look {first} {n} {seed}"), "LOOKED");
        Census {
            zero: r.u64("zero"),
            matching: r.u64("match"),
            other: r.u64("other"),
        }
    }

    fn purge(&mut self) -> Reply {
        self.ask("purge", "PURGED")
    }

    fn rss_kb(&mut self) -> u64 {
        self.ask("rss", "RSS").u64("kb")
    }

    /// Ends the peer; returns how many losses its unmarks reported.
    fn finish(mut self) -> u64 {
        assert!(self.0.send("exit"));
        let bye = self.0.expect("BYE", SYNC);
        let exit = self.0.wait(SYNC);
        assert_eq!(exit, Exit::Code(0), "peer\n{}", self.0.diagnostics());
        bye.u64("losses")
    }
}

fn shared_region(len: usize) -> VolatileRegion {
    let r = VolatileRegion::new(
        len,
        Options {
            shared: true,
            ..Options::default()
        },
    )
    .expect("create a shared region");
    assert_eq!(r.policy(), Policy::Managed, "shared regions are managed");
    r
}

/// The pin-and-purge scenario of the two tests that differ only in how the descriptor travels.
fn pin_blocks_purge(test: &str, pass: Pass) {
    const LEN: usize = 4 * MIB;
    const SEED1: u64 = 31;
    const SEED2: u64 = 32;
    const SEED3: u64 = 33;
    let _serial = serial();
    quiet_reclaimer();
    let r = shared_region(LEN);
    let pages = (LEN / page_size()) as u64;
    let all = |seed_matching: u64| Census {
        zero: 0,
        matching: seed_matching,
        other: 0,
    };
    let zeros = Census {
        zero: pages,
        matching: 0,
        other: 0,
    };
    let here = |seed| census(r.as_ptr(), r.len(), seed);
    fill(r.as_ptr(), r.len(), SEED1);

    // The peer maps it: its first unmark pins it too and reports it intact.
    let mut peer = Peer::start(test, &r, pass);
    assert_eq!(
        peer.unmark(SEED1),
        (0, all(pages)),
        "the peer's first unmark: intact, the creator's content"
    );

    // Our pin goes; the peer's keeps our purge off the region.
    // SAFETY: no reference into the region is held while it is volatile.
    unsafe { r.mark() }.unwrap();
    assert_eq!(
        vrange::purge(usize::MAX),
        0,
        "the peer pins the region: our purge must not touch it"
    );
    assert_eq!(here(SEED1), all(pages), "content intact after our purge");
    assert_eq!(peer.check(SEED1), all(pages), "and in the peer");

    // The peer unpins it too: now a purge in the peer frees it.
    peer.mark();
    let purged = peer.purge();
    assert!(
        purged.u64("bytes") >= LEN as u64,
        "the peer's purge frees the unpinned region: {purged:?}"
    );
    let r1 = r.unmark().unwrap();
    assert_eq!(
        (r1.pages as u64, r1.volatile as u64, r1.purged as u64),
        (pages, pages, pages),
        "our next unmark reports the peer's purge"
    );
    assert_eq!(here(SEED1), zeros, "purged content reads zero here");
    assert_eq!(
        peer.unmark(SEED1),
        (pages, zeros),
        "the peer's next unmark reports its purge, and it reads zero there"
    );

    // Both pinned again. A pin here keeps the peer's purge off; a cycle without a purge is
    // intact for both.
    fill(r.as_ptr(), r.len(), SEED2);
    peer.mark();
    let p = peer.purge();
    assert_eq!(
        p.u64("bytes"),
        0,
        "we pin it: the peer's purge must not touch it"
    );
    assert_eq!(vrange::purge(usize::MAX), 0, "nothing of ours is volatile");
    // SAFETY: as above.
    unsafe { r.mark() }.unwrap();
    let r2 = r.unmark().unwrap();
    assert_eq!(r2.purged, 0, "mark and unmark without a purge: intact here");
    assert_eq!(here(SEED2), all(pages));
    assert_eq!(
        peer.unmark(SEED2),
        (0, all(pages)),
        "and intact in the peer, which sees our refill"
    );

    // A purge here while both are unpinned; we unmark and refill before the peer unmarks: the
    // peer still learns that it lost its view, though the content it finds is not zero.
    peer.mark();
    // SAFETY: as above.
    unsafe { r.mark() }.unwrap();
    assert!(
        vrange::purge(usize::MAX) >= LEN,
        "our purge frees the unpinned region"
    );
    let r3 = r.unmark().unwrap();
    assert_eq!(r3.purged as u64, pages, "our unmark reports our purge");
    assert_eq!(here(SEED3), zeros, "purged content reads zero");
    fill(r.as_ptr(), r.len(), SEED3);
    assert_eq!(
        peer.unmark(SEED3),
        (pages, all(pages)),
        "the peer reports the purge it missed, and finds our refill"
    );

    // A last cycle without a purge: intact in both.
    // SAFETY: as above.
    unsafe { r.mark() }.unwrap();
    peer.mark();
    assert_eq!(r.unmark().unwrap().purged, 0, "intact here");
    assert_eq!(peer.unmark(SEED3), (0, all(pages)), "intact in the peer");
    assert_eq!(here(SEED3), all(pages));

    let peer_losses = peer.finish();
    let stats = vrange::stats();
    let explicit = stats.source(vrange::Source::Explicit);
    println!(
        "{test}: {pages} pages; the peer's purge freed {} bytes in {} µs; our losses reported \
         {}, the peer's {peer_losses}; our explicit purges: {} events, {} bytes",
        purged.u64("bytes"),
        purged.u64("reaction_ns") / 1000,
        stats.losses_reported,
        explicit.events,
        explicit.bytes
    );
    assert_eq!(peer_losses, 2, "the peer saw two purges");
}

/// A shared region pinned by one process is never purged by the other; once both unpin it, a
/// purge in the peer frees it, and both learn of it at their next unmark (all pages purged,
/// reading zero); a purge in this process after which it refills the region is still reported
/// by the peer's unmark (it lost its view); mark/unmark cycles without a purge are intact in
/// both. The descriptor reaches the peer by inheritance.
#[test]
fn pin_in_one_process_blocks_purge_by_the_other() {
    if let Some(role) = role() {
        return play(&role);
    }
    pin_blocks_purge(PIN_TEST, Pass::Inherit);
}

/// The same, with the descriptor sent over a UNIX socket (SCM_RIGHTS) to a peer that did not
/// inherit it.
#[test]
fn pin_in_one_process_blocks_purge_by_the_other_fd_over_unix_socket() {
    if let Some(role) = role() {
        return play(&role);
    }
    pin_blocks_purge(SOCKET_TEST, Pass::Socket);
}

fn fstat(fd: BorrowedFd<'_>) -> libc::stat {
    // SAFETY: an all-zero stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is valid for the borrow; st is writable.
    assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
    st
}

/// Allocated bytes of the file behind `fd` (st_blocks).
fn file_bytes(fd: BorrowedFd<'_>) -> u64 {
    fstat(fd).st_blocks as u64 * 512
}

/// The size of the file behind `fd`.
fn file_size(fd: BorrowedFd<'_>) -> u64 {
    fstat(fd).st_size as u64
}

/// A purge in the peer really frees the memory, for both processes: the memfd's allocated
/// blocks drop to the header page, and the region's resident pages drop to (at most) the
/// header page in both mappings. Marking alone frees nothing.
#[test]
fn purge_by_other_process_frees_memory() {
    if let Some(role) = role() {
        return play(&role);
    }
    const LEN: usize = 32 * MIB;
    const SEED: u64 = 41;
    let _serial = serial();
    quiet_reclaimer();
    let r = shared_region(LEN);
    let page = page_size() as u64;
    let fd = r.shared_fd().unwrap();
    let rss_kb = || {
        procfs::smaps_of(r.as_ptr() as usize)
            .unwrap()
            .expect("mapped")
            .rss_kb
    };
    let shmem_kb = || procfs::meminfo_kb("Shmem").ok().flatten().unwrap_or(0);
    fill(r.as_ptr(), r.len(), SEED);
    let pages = LEN as u64 / page;

    let mut peer = Peer::start(FREE_TEST, &r, Pass::Inherit);
    let (purged, c) = peer.unmark(SEED);
    assert_eq!(
        (purged, c.matching),
        (0, pages),
        "the peer sees the content"
    );
    let filled = (file_bytes(fd), rss_kb(), peer.rss_kb(), shmem_kb());
    assert!(
        filled.0 >= LEN as u64 && filled.1 >= LEN as u64 / 1024 && filled.2 >= LEN as u64 / 1024,
        "filled: file {} bytes, resident here {} kB, in the peer {} kB",
        filled.0,
        filled.1,
        filled.2
    );

    // SAFETY: no reference into the region is held while it is volatile.
    unsafe { r.mark() }.unwrap();
    peer.mark();
    let marked = (file_bytes(fd), rss_kb(), peer.rss_kb());
    assert_eq!(
        (marked.0, marked.1, marked.2),
        (filled.0, filled.1, filled.2),
        "marking alone frees nothing"
    );

    let p = peer.purge();
    assert!(p.u64("bytes") >= LEN as u64, "{p:?}");
    let after = (file_bytes(fd), rss_kb(), peer.rss_kb(), shmem_kb());
    println!(
        "{FREE_TEST}: memfd allocated {} -> {} bytes; resident here {} -> {} kB, in the peer \
         {} -> {} kB; system Shmem {} -> {} kB; the peer's purge took {} µs",
        filled.0,
        after.0,
        filled.1,
        after.1,
        filled.2,
        after.2,
        filled.3,
        after.3,
        p.u64("reaction_ns") / 1000
    );
    // The header and the page table come before the data, in the file and in each mapping.
    let header = file_size(fd) - LEN as u64;
    assert!(
        header < LEN as u64 / 100,
        "header and page table: {header} bytes for {LEN}"
    );
    assert!(
        after.0 <= header,
        "the memfd keeps at most its header and page table allocated: {} of {header} bytes",
        after.0
    );
    assert!(
        after.1 <= header / 1024 && after.2 <= header / 1024,
        "no data page stays resident in either process: here {} kB, in the peer {} kB",
        after.1,
        after.2
    );

    let u = r.unmark().unwrap();
    assert_eq!(
        u.purged as u64, pages,
        "our unmark reports the peer's purge"
    );
    assert!(is_zero(r.as_ptr(), r.len()), "and the content reads zero");
    let (purged, c) = peer.unmark(SEED);
    assert_eq!((purged, c.zero), (pages, pages), "so does the peer's");
    peer.finish();
}

/// A purge punches the hole through this process's mapping of the region, not through its
/// descriptor: the program may close that descriptor and put a file of its own at the number
/// (regression: a purge through the descriptor could not punch then, and once counted the region
/// as freed anyway). The region is freed and reported purged, the program's file is never
/// touched, and the region no longer offers the program's descriptor as its own.
#[test]
fn purge_with_the_descriptor_closed_by_the_program_frees_the_region_not_the_programs_file() {
    const LEN: usize = 4 * MIB;
    const SEED: u64 = 43;
    let _serial = serial();
    quiet_reclaimer();
    let r = shared_region(LEN);
    fill(r.as_ptr(), r.len(), SEED);
    let number = r.shared_fd().unwrap().as_raw_fd();
    // The program's own file, full of ones, as big as the region and its header.
    let mine = tempfile_of(LEN + page_size(), 1);
    // SAFETY: no reference into the region is held while it is volatile.
    unsafe { r.mark() }.unwrap();
    // The program puts its own file at the region's number: dup2 closes and replaces in one
    // step (a close first would leave the number free for another thread for a moment).
    // SAFETY: dup2 between descriptors of this process; no memory effects.
    assert_eq!(unsafe { libc::dup2(mine.as_raw_fd(), number) }, number);
    let lost_before = vrange::stats().descriptors_lost;
    let freed = vrange::purge(usize::MAX);
    assert_eq!(freed, LEN, "the purge did not free the region");
    assert_eq!(
        file_bytes(mine.as_fd()),
        (LEN + page_size()) as u64,
        "the program's file was punched"
    );
    assert!(
        r.shared_fd().is_none(),
        "the region still offers the program's descriptor"
    );
    let report = r.unmark().unwrap();
    assert!(report.was_purged(), "not reported purged: {report:?}");
    assert!(
        is_zero(r.as_ptr(), r.len()),
        "the purged content does not read zero"
    );
    // SAFETY: the test's own descriptor at that number.
    unsafe { libc::close(number) };
    drop(r);
    assert!(
        vrange::stats().descriptors_lost > lost_before,
        "freeing the region did not count its descriptor as lost"
    );
}

/// A file of `len` bytes of `byte`, already unlinked.
fn tempfile_of(len: usize, byte: u8) -> OwnedFd {
    let path = std::env::temp_dir().join(format!("vrange-shared-mine-{}", std::process::id()));
    let mut f = std::fs::File::create(&path).unwrap();
    std::io::Write::write_all(&mut f, &vec![byte; len]).unwrap();
    f.sync_all().unwrap();
    std::fs::remove_file(&path).unwrap();
    f.into()
}

/// Freeing a shared region unmaps the header page that holds its ranges' state; threads that
/// scan every range meanwhile (statistics, the reclaimer's candidates, an explicit purge) must
/// never read it after it is gone, and a purge must not act on a range freed since its
/// snapshot. Before both were so, this test died of SIGSEGV in most runs (as did a peer of the
/// pin tests at its exit, once, in CI under load).
#[test]
fn freeing_shared_regions_while_other_threads_scan_every_range() {
    if let Some(role) = role() {
        return play(&role);
    }
    const ROUNDS: usize = 10_000;
    let _serial = serial();
    quiet_reclaimer();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let scans = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        let scanners: Vec<_> = (0..2)
            .map(|i| {
                let (stop, scans) = (&stop, &scans);
                s.spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        if i == 0 {
                            std::hint::black_box(vrange::stats());
                        } else {
                            vrange::purge(page_size());
                        }
                        scans.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for round in 0..ROUNDS {
            // Created pinned.
            let r = shared_region(4 * page_size());
            fill(r.as_ptr(), r.len(), round as u64);
            if round % 2 == 0 {
                // Volatile: a purge candidate while it is freed.
                // SAFETY: no reference into the region is held while it is volatile.
                unsafe { r.mark() }.unwrap();
            }
            drop(r);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in scanners {
            t.join().expect("a scanner");
        }
    });
    assert!(
        scans.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "the scanners ran"
    );
}

// ---- Page ranges: the semantics ashmem and Chromium's discardable memory give ----

const ASHMEM_TEST: &str = "ashmem_pin_and_unpin_of_overlapping_page_ranges";
const CHROMIUM_TEST: &str = "chromium_lock_unlock_of_sub_ranges_from_two_processes_at_once";
const KILLED_TEST: &str = "a_holder_sigkilled_while_pinning_releases_its_pages_within_a_tick";
const FORK_TEST: &str = "fork_with_a_pinned_shared_range";

/// Pins pages `[first, first + n)` of `r` here: ((pages, volatile, purged), census for `seed`).
fn pin_here(r: &VolatileRegion, first: usize, n: usize, seed: u64) -> ((u64, u64, u64), Census) {
    let page = page_size();
    let u = r
        .unmark_range(first * page, n * page)
        .expect("unmark_range");
    (
        (u.pages as u64, u.volatile as u64, u.purged as u64),
        census_at(r.as_ptr(), first, n, seed),
    )
}

fn unpin_here(r: &VolatileRegion, first: usize, n: usize) {
    let page = page_size();
    // SAFETY: the test holds no reference into the pages while they are volatile.
    unsafe { r.mark_range(first * page, n * page) }.expect("mark_range");
}

/// `n` pages holding the pattern.
fn intact(n: u64) -> Census {
    Census {
        zero: 0,
        matching: n,
        other: 0,
    }
}

/// `n` pages reading zero.
fn zeros(n: u64) -> Census {
    Census {
        zero: n,
        matching: 0,
        other: 0,
    }
}

/// What each page-range test starts from: the tests' serial guard, this process's reclaimer
/// quiet, a shared region of `pages` pages filled with `seed` (pinned here, as made) and a
/// peer (of test `test`) that maps it and pins nothing yet.
fn setup(
    test: &str,
    pages: usize,
    seed: u64,
    pass: Pass,
) -> (std::sync::MutexGuard<'static, ()>, VolatileRegion, Peer) {
    let serial = serial();
    quiet_reclaimer();
    let r = shared_region(pages * page_size());
    fill(r.as_ptr(), r.len(), seed);
    let peer = Peer::start(test, &r, pass);
    (serial, r, peer)
}

/// Android's ashmem semantics over page ranges of one region, between two processes (each
/// mapping pins as ashmem's ASHMEM_PIN and ASHMEM_UNPIN do, with a page range): a range
/// pinned in the middle of a region nobody else pins keeps the purge off it and only it; an
/// unpin across two pinned ranges (and the gap between them) leaves their outer parts pinned;
/// a purge is reported by the next pin of each process, page by page, even after the other
/// process pinned and refilled the pages, and only once.
#[test]
fn ashmem_pin_and_unpin_of_overlapping_page_ranges() {
    if let Some(role) = role() {
        return play(&role);
    }
    const N: usize = 16;
    const SEED: u64 = 51;
    const SEED2: u64 = 52;
    let (_serial, r, mut peer) = setup(ASHMEM_TEST, N, SEED, Pass::Inherit);
    let page = page_size();

    // A range pinned in the middle of a region nobody else pins.
    unpin_here(&r, 0, N);
    assert_eq!(
        peer.pin(6, 4, SEED),
        ((4, 4, 0), intact(4)),
        "the peer pins pages 6..10: intact"
    );
    assert_eq!(
        vrange::purge(usize::MAX),
        12 * page,
        "a purge takes the 12 pages no process pins, not the middle"
    );
    assert_eq!(peer.look(6, 4, SEED), intact(4), "the middle stays intact");
    assert_eq!(
        peer.pin(4, 8, SEED),
        (
            (8, 4, 4),
            Census {
                zero: 4,
                matching: 4,
                other: 0
            }
        ),
        "a pin over the middle and beyond: 4 pages were not pinned, all 4 of them purged"
    );
    assert_eq!(
        pin_here(&r, 0, N, SEED),
        (
            (16, 16, 12),
            Census {
                zero: 12,
                matching: 4,
                other: 0
            }
        ),
        "here: every page volatile, the 12 purged ones reported, the middle intact"
    );
    fill(r.as_ptr(), r.len(), SEED);

    // An unpin across two pinned ranges.
    peer.unpin(4, 8);
    assert_eq!(
        peer.pin(2, 3, SEED),
        ((3, 3, 2), intact(3)),
        "pages 2 and 3 were purged since the peer last held them: reported, though refilled"
    );
    assert_eq!(
        peer.pin(9, 3, SEED),
        ((3, 3, 0), intact(3)),
        "the peer held 9..12 through the purge"
    );
    peer.unpin(4, 6);
    unpin_here(&r, 0, N);
    assert_eq!(
        vrange::purge(usize::MAX),
        12 * page,
        "after the peer unpinned 4..10 across its two ranges, it still pins 2..4 and 10..12"
    );
    assert_eq!(peer.look(2, 2, SEED), intact(2));
    assert_eq!(peer.look(10, 2, SEED), intact(2));
    assert_eq!(
        peer.pin(0, N, SEED),
        (
            (16, 12, 12),
            Census {
                zero: 12,
                matching: 4,
                other: 0
            }
        ),
        "the peer pins everything: 12 pages were not pinned, all purged"
    );

    // Purge, then a pin reports it in each process, even after the other refilled.
    peer.fill(0, N, SEED2);
    peer.unpin(4, 4);
    assert_eq!(vrange::purge(usize::MAX), 4 * page, "the 4 pages unpinned");
    assert_eq!(
        pin_here(&r, 4, 4, SEED2),
        ((4, 4, 4), zeros(4)),
        "here: purged, zero"
    );
    fill_at(r.as_ptr(), 4 * page, 4 * page, SEED2);
    assert_eq!(
        peer.pin(4, 4, SEED2),
        ((4, 4, 4), intact(4)),
        "the peer's pin reports the purge, and finds our refill"
    );
    assert_eq!(
        peer.pin(4, 4, SEED2),
        ((4, 0, 0), intact(4)),
        "reported once: pinned again, nothing to report"
    );
    assert_eq!(peer.pin(0, N, SEED2), ((16, 0, 0), intact(16)));
    assert_eq!(
        vrange::purge(usize::MAX),
        0,
        "every page pinned by one process or both"
    );
    let losses = peer.finish();
    println!("{ASHMEM_TEST}: the peer reported {losses} losses");
    assert_eq!(losses, 4, "the peer's pins that reported a purge");
}

/// Chromium's discardable shared memory, locked and unlocked by page ranges from two
/// processes at once while a third thread purges in a loop: each process owns (writes) half
/// of a region and locks ranges that reach into the other half, as a renderer and the browser
/// lock the spans they use (`DiscardableSharedMemory::Lock(offset, length)` and `Unlock`).
/// Each checks, on its own pages: a lock that reports nothing purged finds them intact, pages
/// found zero were reported purged, no page is half written, and nothing is lost while locked.
#[test]
fn chromium_lock_unlock_of_sub_ranges_from_two_processes_at_once() {
    if let Some(role) = role() {
        return play(&role);
    }
    const N: usize = 16;
    const SEED: u64 = 61;
    const MILLIS: u64 = 1500;
    let (_serial, r, mut peer) = setup(CHROMIUM_TEST, N, SEED, Pass::Socket);
    unpin_here(&r, 0, N);
    // Ours: pages 0..8; the peer's: 8..16; the ranges overlap each other and both halves.
    assert!(peer
        .0
        .send(&format!("hammer {MILLIS} {SEED} 8 8 8 4 6 8 12 4 4 6")));
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (ours, freed) = std::thread::scope(|s| {
        let purger = s.spawn(|| {
            let mut freed = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                freed += vrange::purge(usize::MAX);
                std::thread::sleep(Duration::from_micros(200));
            }
            freed
        });
        let ours = hammer(
            &r,
            Duration::from_millis(MILLIS),
            SEED,
            (0, 8),
            &[(0, 4), (2, 8), (6, 6), (1, 10)],
        );
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (ours, purger.join().expect("the purger"))
    });
    let theirs = peer.0.expect("HAMMERED", SYNC);
    println!(
        "{CHROMIUM_TEST}: {MILLIS} ms; here {} pins, {} reporting purges, {} refills; the peer \
         {} pins, {} reporting purges, {} refills; the purger freed {} KiB",
        ours.pins,
        ours.purged,
        ours.refills,
        theirs.u64("pins"),
        theirs.u64("purged"),
        theirs.u64("refills"),
        freed / 1024
    );
    assert_eq!(ours.violations, 0, "here: {}", ours.first);
    assert_eq!(
        theirs.u64("violations"),
        0,
        "in the peer: {}",
        theirs.str("first")
    );
    assert!(
        freed > 0,
        "the purger never purged: the test proved nothing"
    );
    assert!(
        ours.purged + theirs.u64("purged") > 0,
        "no lock reported a purge: the test proved nothing"
    );
    assert!(ours.pins > 0 && theirs.u64("pins") > 0);
    peer.finish();
}

/// A process holding pins (one range pinned, another pinned and unpinned in a loop) is killed
/// with SIGKILL: its pins die with it. While it lives, no purge touches what it pins; once it
/// is dead (a zombie: nobody has waited for it yet), this process's reclaimer releases its
/// pins within one tick (100 ms here, plus the time a loaded machine takes to run the thread),
/// and the next purge takes those pages; this process's next pin reports them purged.
#[test]
fn a_holder_sigkilled_while_pinning_releases_its_pages_within_a_tick() {
    if let Some(role) = role() {
        return play(&role);
    }
    const N: usize = 16;
    const SEED: u64 = 71;
    let (_serial, r, mut peer) = setup(KILLED_TEST, N, SEED, Pass::Inherit);
    let tick = vrange::Config::current().poll_interval;
    let page = page_size();
    assert_eq!(peer.pin(4, 4, SEED), ((4, 4, 0), intact(4)));
    peer.ask("spin 8 4", "SPINNING");
    unpin_here(&r, 0, N);
    let released_before = vrange::stats().dead_holders_released;

    // Alive: its pins hold, tick after tick.
    let mut freed = 0;
    let alive_until = Instant::now() + 3 * tick;
    while Instant::now() < alive_until {
        freed += vrange::purge(usize::MAX);
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(freed >= 8 * page, "the 8 pages nobody pins were purged");
    assert_eq!(
        census_at(r.as_ptr(), 4, 4, SEED),
        intact(4),
        "pages a live holder pins are never purged"
    );
    assert_eq!(vrange::stats().dead_holders_released, released_before);

    // Killed while pinning: the pages it pinned become purgeable within a tick of its death.
    let pid = peer.0.pid();
    // SAFETY: the peer is this process's child, not yet waited for.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let killed = Instant::now();
    let deadline = killed + tick + Duration::from_secs(2);
    let mut dead_at = None;
    let released_at = loop {
        if dead_at.is_none()
            && procfs::stat(Some(pid as u32)).is_ok_and(|s| matches!(s.state, 'Z' | 'X'))
        {
            dead_at = Some(Instant::now());
        }
        vrange::purge(usize::MAX);
        if census_at(r.as_ptr(), 4, 8, SEED).zero == 8 {
            break Instant::now();
        }
        assert!(
            Instant::now() < deadline,
            "the dead holder's pages were not purgeable {:?} after the kill",
            deadline - killed
        );
        std::thread::sleep(Duration::from_millis(1));
    };
    let dead_at = dead_at.unwrap_or(released_at);
    println!(
        "{KILLED_TEST}: tick {tick:?}; killed → zombie {:?}, zombie → pages purged {:?}",
        dead_at - killed,
        released_at.saturating_duration_since(dead_at)
    );
    assert_eq!(
        vrange::stats().dead_holders_released,
        released_before + 1,
        "this process's reclaimer released the dead holder"
    );
    assert!(
        released_at.saturating_duration_since(dead_at) <= tick + Duration::from_secs(1),
        "released {:?} after the death (tick {tick:?})",
        released_at.saturating_duration_since(dead_at)
    );
    assert_eq!(
        pin_here(&r, 0, N, SEED),
        ((16, 16, 16), zeros(16)),
        "every page purged, and reported here"
    );
    assert_eq!(peer.0.wait(SYNC), Exit::Signal(libc::SIGKILL));
}

/// A process pins a range and forks: the child's inherited mapping holds none of its parent's
/// pins, takes a holder number of its own at its first pin, and its death (SIGKILL) releases
/// its pins only: the pages the parent pins stay intact and pinned, the pages only the child
/// pinned become purgeable.
#[test]
fn fork_with_a_pinned_shared_range() {
    if let Some(role) = role() {
        return play(&role);
    }
    const N: usize = 16;
    const SEED: u64 = 81;
    let (_serial, r, mut peer) = setup(FORK_TEST, N, SEED, Pass::Inherit);
    let tick = vrange::Config::current().poll_interval;
    let page = page_size();
    assert_eq!(peer.pin(0, 8, SEED), ((8, 8, 0), intact(8)));
    unpin_here(&r, 0, N);
    assert_eq!(
        vrange::purge(usize::MAX),
        8 * page,
        "pages 8..16: nobody pins them"
    );

    // The peer forks; its child pins 4..12.
    let child = peer.ask(&format!("forkpin 4 8 {SEED}"), "FORKPINNED");
    assert_eq!(
        (
            child.u64("pages"),
            child.u64("volatile"),
            child.u64("purged"),
            child.u64("zero"),
            child.u64("match"),
            child.u64("other")
        ),
        (8, 8, 4, 4, 4, 0),
        "the child holds none of its parent's pins (all 8 were volatile to it), sees the \
         parent's pinned pages intact and the 4 purged ones purged: {child:?}"
    );
    assert_eq!(
        vrange::purge(usize::MAX),
        0,
        "0..8 pinned by the parent, 8..12 by the child, 12..16 purged already"
    );

    // The child dies: its pins go, its parent's stay.
    let killed = peer.ask("forkkill", "FORKKILLED");
    assert_eq!(
        Exit::decode(killed.u64("exit")),
        Exit::Signal(libc::SIGKILL),
        "the child was killed"
    );
    let deadline = Instant::now() + tick + Duration::from_secs(2);
    let mut freed = 0;
    while freed < 4 * page {
        freed += vrange::purge(usize::MAX);
        assert!(
            Instant::now() < deadline,
            "the dead child's pages were not purgeable in time ({freed} bytes)"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(freed, 4 * page, "only the pages the child alone pinned");
    assert_eq!(
        peer.look(0, 8, SEED),
        intact(8),
        "the parent's pages are intact"
    );
    assert_eq!(
        peer.pin(0, 8, SEED),
        ((8, 0, 0), intact(8)),
        "and still pinned by the parent: the child's death released none of its pins"
    );
    peer.unpin(0, 8);
    assert_eq!(
        vrange::purge(usize::MAX),
        8 * page,
        "once the parent unpins them"
    );
    assert_eq!(
        peer.pin(0, N, SEED),
        ((16, 16, 16), zeros(16)),
        "every page purged, and reported to the parent"
    );
    peer.finish();
}

/// The data length in a region's file is any mapping process's to overwrite. A mapping, and a
/// coordinator's handle, keep the length they checked when they mapped the region and never
/// read past it; a new mapping of a file whose length no longer fits it is refused.
#[test]
fn a_length_overwritten_in_the_file_is_not_believed() {
    use std::os::unix::fs::FileExt;
    let _serial = serial();
    let len = 16 * page_size();
    let r = shared_region(len);
    let fd = r.shared_fd().unwrap();
    let handle = vrange::coordination::SharedHandle::open(fd.try_clone_to_owned().unwrap())
        .expect("a handle on the region");
    let file = std::fs::File::from(fd.try_clone_to_owned().unwrap());
    // The header's third word: the data length.
    let mut was = [0u8; 8];
    file.read_exact_at(&mut was, 16).unwrap();
    assert_eq!(
        u64::from_le_bytes(was),
        len as u64,
        "the layout this test assumes"
    );
    file.write_all_at(&(1u64 << 40).to_le_bytes(), 16).unwrap();
    assert_eq!(handle.len(), len);
    let row = handle.census(1);
    assert_eq!(row.len, len as u64, "{row:?}");
    assert_eq!(
        row.pinned + row.volatile + row.purged,
        len as u64,
        "{row:?}"
    );
    // The mapping's own calls see its pages only.
    // SAFETY: the region's content is not relied on.
    unsafe { r.mark() }.unwrap();
    let row = handle.census(1);
    assert_eq!(row.volatile, len as u64, "{row:?}");
    let mut volatile = 0;
    handle.volatile(|bytes, _| volatile += bytes);
    assert_eq!(volatile, len as u64);
    let back = r.unmark().unwrap();
    assert_eq!(
        (back.pages, back.volatile, back.purged),
        (len / page_size(), len / page_size(), 0)
    );
    assert!(VolatileRegion::open_shared(fd, Priority::Normal).is_err());
    assert!(vrange::coordination::SharedHandle::open(fd.try_clone_to_owned().unwrap()).is_err());
    file.write_all_at(&was, 16).unwrap();
    assert!(VolatileRegion::open_shared(fd, Priority::Normal).is_ok());
}

const HOLDERS_TEST: &str = "a_new_mapping_takes_a_number_a_dead_holder_held";
const HOLDERS_ROLE: &str = "holders";

/// In a process without a reclaimer (nothing else reaps): 31 fork children map the region (the
/// creator is the 32nd holder) and the next mapping is refused with EUSERS; the children die
/// without unmapping, and the next mapping takes the number of one of them.
fn dead_holders() {
    let r = shared_region(16 * page_size());
    let fd = r.shared_fd().unwrap();
    let children: Vec<_> = (1..32)
        .map(|_| {
            let (child, link) = fork_linked(|link| {
                let mapped = VolatileRegion::open_shared(fd, Priority::Normal);
                let ok = mapped.is_ok();
                // Dies holding its number: nothing unmaps the region.
                std::mem::forget(mapped);
                link.send(&[u64::from(ok)]);
                let _ = link.recv::<1>(Duration::from_secs(60));
                0
            });
            let ok = link
                .recv::<1>(Duration::from_secs(30))
                .expect("the child maps");
            assert_eq!(ok, [1], "a child maps the region");
            (child, link)
        })
        .collect();
    let full = VolatileRegion::open_shared(fd, Priority::Normal).err();
    for (mut child, link) in children {
        // Told to go (a closed link is not seen: the later children hold its end too).
        link.send(&[0]);
        assert_eq!(child.wait(Duration::from_secs(30)), Exit::Code(0));
    }
    let after = VolatileRegion::open_shared(fd, Priority::Normal);
    say(format_args!(
        "DONE full={} after={}",
        matches!(full, Some(vrange::Error::Os(libc::EUSERS))),
        after.is_ok()
    ));
}

#[test]
fn a_new_mapping_takes_a_number_a_dead_holder_held() {
    if let Some(role) = role() {
        return play(&role);
    }
    let _serial = serial();
    let mut cmd = role_command(HOLDERS_TEST, HOLDERS_ROLE);
    cmd.env("VRANGE_RECLAIMER", "off");
    let mut p = Role::spawn(HOLDERS_ROLE, cmd);
    let reply = p.next(Duration::from_secs(60));
    let exit = p.wait(Duration::from_secs(30));
    let reply = reply.unwrap_or_else(|e| panic!("{e}; {exit}\n{}", p.diagnostics()));
    assert_eq!(
        reply.get::<bool>("full"),
        Some(true),
        "32 holders fill the region: {reply:?}"
    );
    assert_eq!(
        reply.get::<bool>("after"),
        Some(true),
        "a dead holder's number is taken: {reply:?}"
    );
    assert_eq!(exit, Exit::Code(0));
}
