//! Hostile input: the wire format and the participant's side of the protocol against random,
//! truncated and oversized messages and a coordinator of the wrong user. Nothing crashes and
//! nothing is purged; the one well-formed request of an authenticated coordinator is obeyed,
//! which shows that these tests would see a purge if there were one.
//!
//! - `decode_*` (proptest): [`Message::decode`] never panics on any bytes, accepts only
//!   canonical encodings, every message round-trips, and its damaged forms (every strict prefix,
//!   every single-byte change of the header) are refused or decode to another message.
//! - `a_participant_drops_a_hostile_coordinator_and_purges_nothing`: the test process is a fake
//!   coordinator; a participant connects, and each connection gets one kind of hostile input.
//!   The participant closes every one of them at once, stays alive, purges nothing, reconnects,
//!   and then obeys a proper `Welcome` and `Purge`.
//! - `a_participant_refuses_a_coordinator_of_another_user`: a fake coordinator running as
//!   `nobody` sends `Welcome` and `Purge` to whoever connects; a root participant never counts
//!   the connection, never says `Hello`, and purges nothing.

// ci: host only: hostile peers on the coordinator's socket, the protocol rather than the kernel

mod common;

use common::{participant, purged_bits, socket_dir, ANSWER, CHUNK};
use proptest::prelude::*;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::{Duration, Instant};
use vrange::coordination::{
    Inventory, Malformed, Message, Row, Status, BUCKETS, CLASSES, MAX_MESSAGE, MAX_SHARED, NAME_LEN,
};
use vrange_sys::sock::{self, Recv};
use vrange_testkit::role::{command, role, role_command, say, Role};
use vrange_testkit::{is_root, serial, skip};

const HEADER: usize = 8;
/// Chunks each participant marks volatile.
const CHUNKS: usize = 4;
/// The uid and gid of `nobody`.
const NOBODY: u32 = 65534;

fn roles() -> bool {
    match role().as_deref() {
        Some("participant") => participant(),
        Some("nobody-coordinator") => nobody_coordinator(),
        Some(_) => panic!("unknown role"),
        None => return false,
    }
    true
}

// ---------------------------------------------------------------------------------------------
// The wire format.

fn encode(m: &Message) -> Vec<u8> {
    let mut buf = [0u8; MAX_MESSAGE];
    let n = m.encode(&mut buf);
    buf[..n].to_vec()
}

/// Every message, with arbitrary fields where the format allows any value.
fn any_message() -> impl Strategy<Value = Message> {
    let inventory = (
        any::<u64>(),
        proptest::collection::vec(any::<u64>(), CLASSES * BUCKETS),
        any::<[u64; 5]>(),
        any::<[u64; MAX_SHARED]>(),
    )
        .prop_map(|(seq, volatile, t, shared)| {
            let mut inv = Inventory {
                seq,
                pinned: t[0],
                purged: t[1],
                purged_total: t[2],
                obeyed: t[3],
                freed_for_coordinator: t[4],
                shared,
                ..Inventory::default()
            };
            for (d, s) in inv.volatile.iter_mut().flatten().zip(volatile) {
                *d = s;
            }
            Message::Inventory(Box::new(inv))
        });
    let row = (
        any::<u32>(),
        any::<u32>(),
        any::<[u8; NAME_LEN]>(),
        any::<[u64; 6]>(),
        0u8..=1,
    )
        .prop_map(|(pid, uid, name, v, responsive)| {
            Message::Row(Box::new(Row {
                pid,
                uid,
                name,
                volatile: v[0],
                pinned: v[1],
                purged: v[2],
                obeyed: v[3],
                freed: v[4],
                quiet_ms: v[5],
                responsive,
            }))
        });
    prop_oneof![
        (any::<u32>(), any::<[u8; NAME_LEN]>())
            .prop_map(|(pid, name)| Message::Hello { pid, name }),
        (1..=u32::MAX).prop_map(|ping_ms| Message::Welcome { ping_ms }),
        any::<u64>().prop_map(|seq| Message::Ping { seq }),
        inventory,
        (any::<u64>(), 0..CLASSES as u8, any::<u64>(), any::<u64>()).prop_map(
            |(id, class, min_age_ms, cold_ms)| Message::Purge {
                id,
                class,
                min_age_ms,
                cold_ms,
            }
        ),
        any::<[u64; 4]>().prop_map(|v| Message::Purged {
            id: v[0],
            bytes: v[1],
            ranges: v[2],
            youngest_ms: v[3],
        }),
        Just(Message::Monitor),
        any::<[u64; 11]>().prop_map(|v| Message::Status(Status {
            participants: v[0],
            rounds: v[1],
            requests: v[2],
            freed: v[3],
            headroom: v[4],
            limit: v[5],
            refused: v[6],
            proactive: v[7],
            proactive_saved: v[8],
            proactive_target: v[9],
            proactive_stalls: v[10],
        })),
        row,
        Just(Message::End),
        (0..CLASSES as u8, any::<u64>(), any::<u64>())
            .prop_map(|(class, len, ino)| Message::Share { class, len, ino }),
        any::<[u64; 2]>().prop_map(|v| Message::Room {
            id: v[0],
            bytes: v[1]
        }),
        (
            any::<u64>(),
            proptest::option::of((0..CLASSES as u8, any::<u64>()))
        )
            .prop_map(|(id, cut)| Message::Roomed { id, cut }),
    ]
}

/// Decodes `bytes`: `None` if refused; what is accepted must be the canonical encoding of the
/// message it decodes to (one encoding per message: no ignored padding, no slack).
fn refused(bytes: &[u8]) -> Result<Option<Message>, TestCaseError> {
    match Message::decode(bytes) {
        Err(Malformed) => Ok(None),
        Ok(m) => {
            prop_assert_eq!(
                encode(&m),
                bytes,
                "accepted a non-canonical encoding of {:?}",
                m
            );
            Ok(Some(m))
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Arbitrary bytes, short, long and longer than any message: no panic; what is accepted is
    /// canonical.
    #[test]
    fn decode_never_panics_on_arbitrary_bytes(
        bytes in proptest::collection::vec(any::<u8>(), 0..=MAX_MESSAGE + 16)
    ) {
        refused(&bytes)?;
    }

    /// A valid header (magic, a known or any kind byte, zero padding) and an arbitrary body of
    /// the right length for the kind of a valid message, or of any length: the body parsers
    /// run on hostile bodies.
    #[test]
    fn decode_never_panics_on_hostile_bodies(
        template in any_message(),
        kind in proptest::option::of(any::<u8>()),
        body in proptest::collection::vec(any::<u8>(), 0..=MAX_MESSAGE),
        fill in any::<u8>(),
        exact in any::<bool>(),
    ) {
        let valid = encode(&template);
        let mut bytes = valid[..HEADER].to_vec();
        if let Some(k) = kind {
            bytes[4] = k;
        }
        let len = if exact { valid.len() - HEADER } else { body.len() };
        bytes.extend(body.iter().copied().chain(std::iter::repeat(fill)).take(len));
        refused(&bytes)?;
    }

    /// Every message round-trips; every strict prefix of its encoding is refused (each kind has
    /// one length); every single-byte change of its header is refused or decodes to another
    /// message (a kind byte changed to another kind of the same length), never to itself.
    #[test]
    fn every_message_round_trips_and_damage_is_refused(m in any_message()) {
        let bytes = encode(&m);
        prop_assert!(bytes.len() <= MAX_MESSAGE);
        prop_assert_eq!(Message::decode(&bytes), Ok(m.clone()));
        for n in 0..bytes.len() {
            prop_assert_eq!(Message::decode(&bytes[..n]), Err(Malformed), "prefix {} of {:?}", n, m);
        }
        let mut longer = bytes.clone();
        longer.push(0);
        prop_assert_eq!(Message::decode(&longer), Err(Malformed));
        for at in 0..HEADER {
            for b in 0..=u8::MAX {
                if b == bytes[at] {
                    continue;
                }
                let mut bad = bytes.clone();
                bad[at] = b;
                let got = refused(&bad)?;
                prop_assert!(got.as_ref() != Some(&m), "byte {} = {} still decodes to {:?}", at, b, m);
                // Only the kind byte can make another message.
                if at != 4 {
                    prop_assert!(got.is_none(), "byte {} = {} decodes to {:?}", at, b, got);
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// A live participant against a fake coordinator.

/// Starts a participant (not in a cgroup) that looks for its coordinator at `socket`. Its own
/// pressure sources are off (PSI, vmpressure, headroom): pressure elsewhere on the machine
/// cannot purge its chunks, so a purged chunk can only have come over the socket.
fn start_participant(test: &str, socket: &Path) -> Role {
    let mut cmd = role_command(test, "participant");
    cmd.env("VRANGE_COORDINATOR", socket)
        .env("VRANGE_PSI", "off")
        .env("VRANGE_VMPRESSURE", "off")
        .env("VRANGE_HEADROOM", "off");
    let mut p = Role::spawn("participant", cmd);
    for i in 0..CHUNKS {
        assert!(p.send("mark"));
        let r = p.expect("MARKED", ANSWER);
        assert_eq!(r.u64("i"), i as u64);
    }
    p
}

fn report(p: &mut Role) -> vrange_testkit::role::Reply {
    assert!(p.send("report"), "the participant still reads its commands");
    p.expect("REPORT", ANSWER)
}

/// Waits up to `timeout` for input on `fd` (or its hang-up).
fn readable(fd: BorrowedFd<'_>, timeout: Duration) -> bool {
    let mut set = [sock::poll_in(fd.as_raw_fd())];
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    sock::poll(&mut set, ms).expect("poll") > 0 && sock::poll_ready(&set[0])
}

/// The next connection within `timeout`.
fn accept_within(listener: BorrowedFd<'_>, timeout: Duration) -> Option<OwnedFd> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(c) = sock::accept(listener).expect("accept") {
            return Some(c);
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        readable(listener, left);
    }
}

/// What a connection gave within a time limit.
#[derive(Debug)]
enum Got {
    Message(Vec<u8>),
    TooLong,
    Closed,
    Nothing,
}

fn next_packet(conn: BorrowedFd<'_>, timeout: Duration) -> Got {
    let deadline = Instant::now() + timeout;
    let mut buf = vec![0u8; MAX_MESSAGE];
    loop {
        match sock::recv(conn, &mut buf) {
            Ok(Recv::Message(n)) => return Got::Message(buf[..n].to_vec()),
            Ok(Recv::TooLong) => return Got::TooLong,
            Ok(Recv::Closed) => return Got::Closed,
            // ECONNRESET and the like: the other end is gone too.
            Err(_) => return Got::Closed,
            Ok(Recv::Empty) => {}
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Got::Nothing;
        }
        readable(conn, left);
    }
}

fn send_raw(conn: BorrowedFd<'_>, bytes: &[u8]) {
    assert_eq!(
        sock::send(conn, bytes).ok(),
        Some(true),
        "send {} bytes",
        bytes.len()
    );
}

/// Sends `bytes`; `false` if the peer had already hung up (EPIPE, ECONNRESET).
fn send_unless_gone(conn: BorrowedFd<'_>, bytes: &[u8]) -> bool {
    match sock::send(conn, bytes) {
        Ok(sent) => {
            assert!(sent, "send {} bytes: the peer's queue is full", bytes.len());
            true
        }
        Err(e) if matches!(e.raw_os_error(), Some(libc::EPIPE | libc::ECONNRESET)) => false,
        Err(e) => panic!("send {} bytes: {e}", bytes.len()),
    }
}

fn send_msg(conn: BorrowedFd<'_>, m: &Message) {
    send_raw(conn, &encode(m));
}

/// Accepts the participant's next connection and reads its `Hello`.
fn accept_participant(listener: BorrowedFd<'_>, p: &mut Role) -> OwnedFd {
    let Some(conn) = accept_within(listener, Duration::from_secs(6)) else {
        panic!(
            "the participant did not connect within 6 s: {:?}\n{}",
            report(p),
            p.diagnostics()
        )
    };
    let cred = sock::peer_cred(conn.as_fd()).expect("SO_PEERCRED");
    assert_eq!(cred.pid, p.pid(), "the connection is the participant's");
    match next_packet(conn.as_fd(), Duration::from_secs(3)) {
        Got::Message(b) => match Message::decode(&b) {
            Ok(Message::Hello { pid, .. }) => assert_eq!(pid as i32, p.pid()),
            other => panic!("expected a Hello, got {other:?}"),
        },
        other => panic!("expected a Hello, got {other:?}"),
    }
    conn
}

/// Random bytes from a fixed-seed xorshift (reproducible), never a valid message.
fn garbage(seed: &mut u64, len: usize) -> Vec<u8> {
    loop {
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                *seed as u8
            })
            .collect();
        if Message::decode(&bytes).is_err() {
            return bytes;
        }
    }
}

/// One hostile connection: the packets sent, in order, right after the participant's `Hello`.
struct Case {
    name: &'static str,
    packets: Vec<Vec<u8>>,
}

fn hostile_cases() -> Vec<Case> {
    // A long ping interval: after a `Welcome` the participant's silence timeout (40 intervals)
    // cannot be what closes the connection.
    let welcome = encode(&Message::Welcome { ping_ms: 60_000 });
    let purge = encode(&Message::Purge {
        id: 7,
        class: 3,
        min_age_ms: 0,
        cold_ms: 0,
    });
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut with_extra = purge.clone();
    with_extra.push(0);
    let mut class_out_of_range = purge.clone();
    class_out_of_range[HEADER + 8] = CLASSES as u8;
    let mut oversized = purge.clone();
    oversized.resize(MAX_MESSAGE + 1, 0);
    let mut huge = welcome.clone();
    huge.extend_from_slice(&purge);
    huge.resize(8 * MAX_MESSAGE, 0xa5);
    let mut welcome_zero = welcome.clone();
    welcome_zero[HEADER..HEADER + 4].copy_from_slice(&0u32.to_le_bytes());
    let hello = encode(&Message::Hello {
        pid: 1,
        name: [b'x'; NAME_LEN],
    });
    let purged = encode(&Message::Purged {
        id: 7,
        bytes: 1,
        ranges: 1,
        youngest_ms: 0,
    });
    let case = |name, packets| Case { name, packets };
    vec![
        case("random garbage", vec![garbage(&mut seed, 40)]),
        case(
            "garbage after the magic",
            vec![[b"VRC1".as_slice(), &garbage(&mut seed, 28)].concat()],
        ),
        case("an empty packet", vec![Vec::new()]),
        case(
            "a truncated Welcome",
            vec![welcome[..welcome.len() - 1].to_vec()],
        ),
        case("a Purge before the Welcome", vec![purge.clone()]),
        case(
            "a Ping before the Welcome",
            vec![encode(&Message::Ping { seq: 1 })],
        ),
        case(
            "a Welcome with ping 0, then a Purge",
            vec![welcome_zero, purge.clone()],
        ),
        case(
            "a truncated Purge, then a Purge",
            vec![
                welcome.clone(),
                purge[..purge.len() - 1].to_vec(),
                purge.clone(),
            ],
        ),
        case(
            "a Purge one byte too long",
            vec![welcome.clone(), with_extra],
        ),
        case(
            "a Purge of a class out of range",
            vec![welcome.clone(), class_out_of_range],
        ),
        case(
            "an oversized packet holding a Purge",
            vec![welcome.clone(), oversized],
        ),
        case(
            "a huge packet holding a Welcome and a Purge",
            vec![welcome.clone(), huge],
        ),
        case(
            "a second Welcome, then a Purge",
            vec![welcome.clone(), welcome.clone(), purge.clone()],
        ),
        case(
            "a participant's messages, then a Purge",
            vec![welcome.clone(), hello, purged, purge.clone()],
        ),
        case(
            "a monitor's End, then a Purge",
            vec![welcome, encode(&Message::End), purge],
        ),
    ]
}

#[test]
fn a_participant_drops_a_hostile_coordinator_and_purges_nothing() {
    if roles() {
        return;
    }
    let _s = serial();
    let dir = socket_dir("hostile");
    let socket = dir.join("coordinator.sock");
    let listener = sock::listen(&socket, 0o600).expect("listen");
    let mut p = start_participant(
        "a_participant_drops_a_hostile_coordinator_and_purges_nothing",
        &socket,
    );
    let mut accepted = 0u64;
    for case in hostile_cases() {
        let conn = accept_participant(listener.as_fd(), &mut p);
        accepted += 1;
        let t0 = Instant::now();
        for packet in &case.packets {
            // The participant may hang up on an early packet of a case (the second of two
            // Welcomes) before the later ones are sent: that is the refusal, come early.
            if !send_unless_gone(conn.as_fd(), packet) {
                break;
            }
        }
        // The packet wakes the participant's reclaimer (the socket is in its poll set), which
        // closes the connection at once (within microseconds here). Before a
        // `Welcome` its silence timeout is 40 s, after one 40 min: closing within 2 s is the
        // refusal, not the timeout.
        let mut answers = Vec::new();
        let closed = loop {
            match next_packet(
                conn.as_fd(),
                Duration::from_secs(2).saturating_sub(t0.elapsed()),
            ) {
                Got::Closed => break true,
                Got::Nothing => break false,
                other => answers.push(other),
            }
        };
        let took = t0.elapsed();
        println!("{}: closed={closed} after {took:?}", case.name);
        assert!(
            closed,
            "{}: the participant kept the connection: {:?}\n{}",
            case.name,
            report(&mut p),
            p.diagnostics()
        );
        assert!(
            answers.is_empty(),
            "{}: the participant answered {answers:?}",
            case.name
        );
        let r = report(&mut p);
        assert_eq!(purged_bits(&r), vec![false; CHUNKS], "{}: {r:?}", case.name);
        assert_eq!(r.u64("requests"), 0, "{}: {r:?}", case.name);
        assert_eq!(r.u64("coordinated"), 0, "{}: {r:?}", case.name);
    }
    let r = report(&mut p);
    assert!(r.u64("connections") >= accepted, "{r:?}");

    // It reconnects, and obeys a well-formed request after a proper Welcome: a purge would
    // have been seen above.
    let conn = accept_participant(listener.as_fd(), &mut p);
    send_msg(conn.as_fd(), &Message::Welcome { ping_ms: 60_000 });
    // The control: a proper Welcome keeps the connection, where each hostile input above
    // closed it at once.
    match next_packet(conn.as_fd(), Duration::from_secs(1)) {
        Got::Nothing => {}
        other => panic!("a proper Welcome: {other:?}\n{}", p.diagnostics()),
    }
    send_msg(
        conn.as_fd(),
        &Message::Purge {
            id: 42,
            class: 3,
            min_age_ms: 0,
            cold_ms: 0,
        },
    );
    let mut purged = None;
    let mut inventory = None;
    while purged.is_none() || inventory.is_none() {
        match next_packet(conn.as_fd(), Duration::from_secs(5)) {
            Got::Message(b) => match Message::decode(&b) {
                Ok(Message::Purged { id, bytes, .. }) => purged = Some((id, bytes)),
                Ok(Message::Inventory(inv)) => inventory = Some(inv),
                other => panic!("unexpected answer {other:?}"),
            },
            other => panic!("no answer to the Purge: {other:?}\n{}", p.diagnostics()),
        }
    }
    assert_eq!(
        purged,
        Some((42, (CHUNKS * CHUNK) as u64)),
        "every chunk purged"
    );
    let inventory = inventory.expect("inventory");
    assert_eq!(inventory.obeyed, 1);
    assert_eq!(inventory.volatile_total(), 0);
    // `coordinated` is set after the answers are sent: give the reclaimer its next tick.
    std::thread::sleep(Duration::from_millis(300));
    let r = report(&mut p);
    println!("after the proper request: {r:?}");
    assert_eq!(purged_bits(&r), vec![true; CHUNKS], "{r:?}");
    assert!(r.u64("requests") >= 1, "{r:?}");
    assert_eq!(r.u64("coordinated"), 1, "{r:?}");

    p.close_stdin();
    let exit = p.wait(Duration::from_secs(10));
    assert_eq!(
        exit,
        vrange_testkit::proc::Exit::Code(0),
        "{}",
        p.diagnostics()
    );
    drop(conn);
    drop(listener);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------------------------
// A coordinator of another user.

/// The `nobody-coordinator` role: becomes `nobody`, listens on `VRT_SOCKET` and says
/// `LISTENING`; on `serve MS` accepts every connection for MS milliseconds, reads whatever
/// comes first, sends `Welcome` and `Purge { class: 3, min_age_ms: 0 }` regardless and reads
/// any answer; then says `SAW accepted= hellos= answers= sent=`.
fn nobody_coordinator() {
    // SAFETY: setgroups, setgid and setuid change only this process's credentials; the order
    // (groups, gid, then uid) keeps the right to change the first two.
    unsafe {
        assert_eq!(libc::setgroups(0, std::ptr::null()), 0, "setgroups");
        assert_eq!(libc::setgid(NOBODY), 0, "setgid");
        assert_eq!(libc::setuid(NOBODY), 0, "setuid");
    }
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, NOBODY);
    let socket = std::env::var("VRT_SOCKET").expect("VRT_SOCKET");
    let listener = sock::listen(Path::new(&socket), 0o666).expect("listen as nobody");
    say("LISTENING");
    let ms: u64 = match command() {
        Some(c) => c
            .strip_prefix("serve ")
            .and_then(|v| v.parse().ok())
            .expect("serve MS"),
        None => return,
    };
    let deadline = Instant::now() + Duration::from_millis(ms);
    let (mut accepted, mut hellos, mut answers, mut sent) = (0, 0, 0, 0);
    let purge = Message::Purge {
        id: 1,
        class: 3,
        min_age_ms: 0,
        cold_ms: 0,
    };
    while let Some(conn) = accept_within(
        listener.as_fd(),
        deadline.saturating_duration_since(Instant::now()),
    ) {
        accepted += 1;
        if let Got::Message(b) = next_packet(conn.as_fd(), Duration::from_millis(200)) {
            if matches!(Message::decode(&b), Ok(Message::Hello { .. })) {
                hellos += 1;
            }
        }
        for m in [Message::Welcome { ping_ms: 100 }, purge.clone()] {
            if sock::send(conn.as_fd(), &encode(&m)).unwrap_or(false) {
                sent += 1;
            }
        }
        while let Got::Message(_) = next_packet(conn.as_fd(), Duration::from_millis(300)) {
            answers += 1;
        }
    }
    say(format!(
        "SAW accepted={accepted} hellos={hellos} answers={answers} sent={sent}"
    ));
    while command().is_some() {}
}

#[test]
fn a_participant_refuses_a_coordinator_of_another_user() {
    if roles() {
        return;
    }
    let _s = serial();
    if !is_root() {
        skip("needs root to run a fake coordinator as another user (nobody)");
        return;
    }
    let test = "a_participant_refuses_a_coordinator_of_another_user";
    let dir = socket_dir("nobody");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    }
    let socket = dir.join("coordinator.sock");
    let mut fake = role_command(test, "nobody-coordinator");
    fake.env("VRT_SOCKET", &socket);
    let mut fake = Role::spawn("nobody-coordinator", fake);
    fake.expect("LISTENING", ANSWER);
    {
        use std::os::unix::fs::MetadataExt;
        let owner = std::fs::metadata(&socket).expect("the fake's socket").uid();
        assert_eq!(owner, NOBODY, "the socket is nobody's");
    }
    let mut p = start_participant(test, &socket);
    // The participant tries once a second from its first tick with volatile memory on.
    assert!(fake.send("serve 4000"));
    let saw = fake.expect("SAW", Duration::from_secs(15));
    let r = report(&mut p);
    println!("fake coordinator: {saw:?}\nparticipant: {r:?}");
    // It did try: the test would have seen a purge had it accepted the coordinator.
    assert!(saw.u64("accepted") >= 2, "the participant tried: {saw:?}");
    assert_eq!(saw.u64("hellos"), 0, "no Hello to a stranger: {saw:?}");
    assert_eq!(saw.u64("answers"), 0, "no answer to a stranger: {saw:?}");
    assert_eq!(r.u64("connections"), 0, "{r:?}");
    assert_eq!(r.u64("requests"), 0, "{r:?}");
    assert_eq!(r.u64("coordinated"), 0, "{r:?}");
    assert_eq!(purged_bits(&r), vec![false; CHUNKS], "{r:?}");

    p.close_stdin();
    assert_eq!(
        p.wait(Duration::from_secs(10)),
        vrange_testkit::proc::Exit::Code(0),
        "{}",
        p.diagnostics()
    );
    fake.close_stdin();
    assert_eq!(
        fake.wait(Duration::from_secs(10)),
        vrange_testkit::proc::Exit::Code(0),
        "{}",
        fake.diagnostics()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
