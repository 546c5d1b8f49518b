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
use vrange_testkit::pattern::{check_at, fill, is_zero};
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
    let page = page_size();
    let mut c = Census {
        zero: 0,
        matching: 0,
        other: 0,
    };
    for off in (0..len).step_by(page) {
        if is_zero(ptr.wrapping_add(off), page) {
            c.zero += 1;
        } else if check_at(ptr, off, page, seed) {
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
    while let Some(cmd) = command() {
        let mut words = cmd.split_whitespace();
        let verb = words.next().unwrap_or_default();
        let mut seed = || -> u64 { words.next().and_then(|w| w.parse().ok()).expect("seed") };
        match verb {
            "unmark" => {
                let seed = seed();
                let u = r.unmark().expect("unmark");
                let c = census(r.as_ptr(), r.len(), seed);
                say(format_args!(
                    "UNMARKED pages={} volatile={} purged={} zero={} match={} other={}",
                    u.pages, u.volatile, u.purged, c.zero, c.matching, c.other
                ));
            }
            "check" => {
                let c = census(r.as_ptr(), r.len(), seed());
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

/// Allocated bytes of the file behind `fd` (st_blocks).
fn file_bytes(fd: BorrowedFd<'_>) -> u64 {
    // SAFETY: an all-zero stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd is valid for the borrow; st is writable.
    assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
    st.st_blocks as u64 * 512
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
    assert!(
        after.0 <= page,
        "the memfd keeps at most its header page allocated: {} bytes",
        after.0
    );
    assert!(
        after.1 <= page / 1024 && after.2 <= page / 1024,
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
