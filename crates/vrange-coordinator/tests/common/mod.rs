//! Roles the coordinator's tests start: participants holding volatile chunks, a hog, a
//! coordinator process; and the plumbing to run them in a memory cgroup.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};
use vrange::{Options, Policy, VolatileRegion};
use vrange_sys::cgroup::{join_before_exec, MemCgroup};
use vrange_testkit::role::{command, role_command, say, Role};

/// How long a role's answer or a participant's connection may take before the test calls it
/// hung: a bound for a hang, not a speed (a shared region's first answer took over 10 s in an
/// emulated guest beside two CPU hogs). A role that does not answer is described thread by
/// thread (`Role::next`).
pub const ANSWER: Duration = Duration::from_secs(60);

pub const MIB: usize = 1 << 20;
/// Bytes of one chunk a participant holds.
pub const CHUNK: usize = 4 * MIB;
/// Chunks of the shared region a participant makes for `range`.
pub const RANGES: usize = 8;

pub fn seed(i: usize) -> u64 {
    i as u64 * 7919 + 11
}

/// The participant role: holds volatile chunks made on command, reports which were purged.
///
/// Commands: `mark` (one more chunk, filled, then volatile; `mark-low`: of the low class,
/// which goes before the default), `fill N [T]` (N more chunks as
/// fast as it can, in T threads, each after `make_room` for it: what vrange-cache does before
/// it maps a slab),
/// `share` (the same in a shared region), `range` (one more chunk as the next page range of a
/// shared region of [`RANGES`] chunks, made at the first, filled, then unpinned), `pin` (one
/// more chunk, filled and kept pinned), `report`, `exit`.
pub fn participant() {
    let managed = Options {
        policy: Policy::Managed,
        ..Options::default()
    };
    let mut volatile: Vec<VolatileRegion> = Vec::new();
    let mut pinned: Vec<(VolatileRegion, u64)> = Vec::new();
    let mut shared: Vec<VolatileRegion> = Vec::new();
    let mut ranged: Option<VolatileRegion> = None;
    let mut ranges = 0;
    while let Some(cmd) = command() {
        match cmd.as_str() {
            "mark" | "mark-low" => {
                let opts = Options {
                    priority: if cmd == "mark-low" {
                        vrange::Priority::Low
                    } else {
                        vrange::Priority::Normal
                    },
                    ..managed
                };
                let mut r = VolatileRegion::new(CHUNK, opts).expect("region");
                {
                    let mut p = r.pin().expect("pin");
                    vrange_testkit::pattern::fill(p.as_mut_ptr(), CHUNK, seed(volatile.len()));
                }
                volatile.push(r);
                say(format!("MARKED i={}", volatile.len() - 1));
            }
            fill if fill.starts_with("fill ") => {
                let mut args = fill[5..]
                    .split(' ')
                    .map(|a| a.parse::<usize>().expect("fill N [T]"));
                let n = args.next().expect("fill N");
                let threads = args.next().unwrap_or(1).max(1);
                let first = volatile.len();
                let room = std::sync::atomic::AtomicUsize::new(0);
                let filled: Vec<Vec<(Option<Instant>, VolatileRegion)>> = std::thread::scope(|s| {
                    let workers: Vec<_> = (0..threads)
                        .map(|t| {
                            let room = &room;
                            s.spawn(move || {
                                let mut mine = Vec::new();
                                for i in (t..n).step_by(threads) {
                                    room.fetch_add(vrange::reclaimer::make_room(CHUNK), Relaxed);
                                    let mut r =
                                        VolatileRegion::new(CHUNK, managed).expect("region");
                                    {
                                        let mut p = r.pin().expect("pin");
                                        vrange_testkit::pattern::fill(
                                            p.as_mut_ptr(),
                                            CHUNK,
                                            seed(first + i),
                                        );
                                    }
                                    // When it became volatile, by the library's own clock
                                    // (the age the purge order goes by).
                                    let idle = r.idle().unwrap_or_default();
                                    let marked = Instant::now().checked_sub(idle);
                                    mine.push((marked, r));
                                }
                                mine
                            })
                        })
                        .collect();
                    workers
                        .into_iter()
                        .map(|w| w.join().expect("filler"))
                        .collect()
                });
                // In the order they became volatile: with several threads that is not their
                // index order. One purged before its age was read has none: it sorts first,
                // as the oldest.
                let mut all: Vec<(Option<Instant>, VolatileRegion)> =
                    filled.into_iter().flatten().collect();
                all.sort_by_key(|(marked, _)| *marked);
                volatile.extend(all.into_iter().map(|(_, r)| r));
                say(format!(
                    "FILLED n={} room_bytes={}",
                    volatile.len(),
                    room.load(Relaxed)
                ));
            }
            "pin" => {
                let r = VolatileRegion::new(CHUNK, managed).expect("region");
                let s = seed(1000 + pinned.len());
                // The region is new, hence pinned: the pattern stays.
                vrange_testkit::pattern::fill(r.as_ptr(), CHUNK, s);
                pinned.push((r, s));
                say("PINNED");
            }
            "share" => {
                let opts = Options {
                    shared: true,
                    ..managed
                };
                let mut r = VolatileRegion::new(CHUNK, opts).expect("shared region");
                {
                    let mut p = r.pin().expect("pin");
                    vrange_testkit::pattern::fill(p.as_mut_ptr(), CHUNK, seed(shared.len()));
                }
                shared.push(r);
                say(format!("SHARED i={}", shared.len() - 1));
            }
            "range" => {
                let r = ranged.get_or_insert_with(|| {
                    let opts = Options {
                        shared: true,
                        ..managed
                    };
                    VolatileRegion::new(RANGES * CHUNK, opts).expect("shared region")
                });
                assert!(ranges < RANGES, "{RANGES} ranges at most");
                // Pinned since the region was made: filled, then unpinned alone.
                vrange_testkit::pattern::fill_at(r.as_ptr(), ranges * CHUNK, CHUNK, seed(ranges));
                // SAFETY: nothing refers into the range while it is volatile.
                unsafe { r.mark_range(ranges * CHUNK, CHUNK) }.expect("mark_range");
                ranges += 1;
                say(format!("RANGED i={}", ranges - 1));
            }
            "report" => {
                let range_bits: String = (0..ranges)
                    .map(|i| {
                        let r = ranged.as_ref().expect("the ranges' region");
                        if r.is_purged_range(i * CHUNK, CHUNK) == Ok(true) {
                            '1'
                        } else {
                            '0'
                        }
                    })
                    .collect();
                let shared_bits: String = shared
                    .iter()
                    .map(|r| if r.is_purged() { '1' } else { '0' })
                    .collect();
                let bits: String = volatile
                    .iter()
                    .map(|r| if r.is_purged() { '1' } else { '0' })
                    .collect();
                let pinned_ok = pinned
                    .iter()
                    .all(|(r, s)| vrange_testkit::pattern::check(r.as_ptr(), CHUNK, *s));
                let all = vrange::stats();
                let st = all.coordinator;
                say(format!(
                    "REPORT purged={bits} shared={shared_bits} ranges={range_bits} pinned_ok={} coordinated={} connections={} requests={} deferred={} own_bytes={}",
                    u8::from(pinned_ok),
                    u8::from(st.connected),
                    st.connections,
                    st.requests,
                    st.deferred,
                    all.purged_total_bytes.saturating_sub(st.bytes)
                ));
            }
            "exit" => break,
            other => panic!("unknown command {other}"),
        }
    }
}

/// Plays the participant role if this process was started as one (then `true`: the test
/// function returns), for test files whose only role it is.
pub fn participant_role() -> bool {
    match vrange_testkit::role::role().as_deref() {
        Some("participant") => participant(),
        Some(_) => panic!("unknown role"),
        None => return false,
    }
    true
}

/// The hog role: touches `VRT_HOG_MIB` MiB in 2 MiB steps every `VRT_HOG_STEP_MS`, says
/// `HOGGED`, then holds it until its input ends.
pub fn hog() {
    vrange_testkit::hog::prefer_oom_kill().expect("oom_score_adj");
    let mib: usize = env("VRT_HOG_MIB").parse().expect("VRT_HOG_MIB");
    let step_ms: u64 = env("VRT_HOG_STEP_MS").parse().expect("VRT_HOG_STEP_MS");
    vrange_testkit::hog::touch(mib * MIB, 2 * MIB, Duration::from_millis(step_ms)).expect("hog");
    say("HOGGED");
    while command().is_some() {}
}

/// The coordinator role: runs a coordinator on `VRT_SOCKET` for cgroup `VRT_CGROUP` until
/// killed (pinging every `VRT_PING_MS` if set).
pub fn coordinator() {
    let mut opts = options(Path::new(&env("VRT_SOCKET")), Path::new(&env("VRT_CGROUP")));
    if let Some(ms) = std::env::var("VRT_PING_MS")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        opts.ping = Duration::from_millis(ms);
    }
    let shared = vrange_coordinator::Shared::default();
    say("LISTENING");
    vrange_coordinator::run(&opts, &shared).expect("coordinator");
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} unset"))
}

/// The tests' coordinator: quick ticks, a fixed headroom of 32 MiB, short timeouts.
pub fn options(socket: &Path, cgroup: &Path) -> vrange_coordinator::Options {
    vrange_coordinator::Options {
        socket: socket.to_path_buf(),
        scope: vrange_coordinator::Scope::Cgroup(cgroup.to_path_buf()),
        interval: Duration::from_millis(50),
        ping: Duration::from_millis(100),
        request_timeout: Duration::from_millis(500),
        headroom: Some(32 << 20),
        metrics: None,
        metrics_pid: false,
        proactive: None,
    }
}

/// Starts role `role` of test `test` in cgroup `cg` with extra environment.
pub fn spawn(test: &str, role: &str, cg: &MemCgroup, env: &[(&str, String)]) -> Role {
    let mut cmd = role_command(test, role);
    for (k, v) in env {
        cmd.env(k, v);
    }
    join_before_exec(&mut cmd, &cg.file("cgroup.procs")).expect("cgroup.procs");
    Role::spawn(role, cmd)
}

/// A directory for one test's socket, removed when dropped (also when the test panics).
pub struct SocketDir(PathBuf);

impl std::ops::Deref for SocketDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for SocketDir {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for SocketDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh directory for one test's socket.
pub fn socket_dir(tag: &str) -> SocketDir {
    let dir = std::env::temp_dir().join(format!("vrange-coord-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).expect("socket dir");
    SocketDir(dir)
}

/// Waits until the coordinator at `socket` has `n` participants (with or without data).
pub fn await_connected(socket: &Path, n: u64, timeout: Duration) -> Result<(), String> {
    let t0 = Instant::now();
    loop {
        let seen = vrange_coordinator::query(socket).map(|(s, _)| s.participants);
        if seen.as_ref().is_ok_and(|&p| p >= n) {
            return Ok(());
        }
        if t0.elapsed() > timeout {
            return Err(format!(
                "{n} participants not connected after {timeout:?}: {seen:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the coordinator at `socket` has `n` participants that reported an inventory.
pub fn await_participants(socket: &Path, n: u64, timeout: Duration) -> Result<(), String> {
    await_with_data(socket, n, n, timeout)
}

/// Waits until `n` participants are connected, `with_data` of them with private volatile data
/// in their inventories (a participant whose data is all in shared regions it passed has none
/// there: [`await_shared`]).
pub fn await_with_data(
    socket: &Path,
    n: u64,
    with_data: u64,
    timeout: Duration,
) -> Result<(), String> {
    let wanted = with_data;
    let t0 = Instant::now();
    loop {
        let seen = vrange_coordinator::query(socket).map(|(s, rows)| {
            (
                s.participants,
                rows.iter().filter(|r| r.volatile > 0).count(),
            )
        });
        if let Ok((p, with_data)) = seen {
            if p >= n && with_data as u64 >= wanted {
                return Ok(());
            }
        }
        if t0.elapsed() > timeout {
            return Err(format!(
                "{n} participants not connected after {timeout:?}: {seen:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the coordinator holds `n` shared regions with volatile pages: its participants
/// passed them, and leave their bytes out of their own inventories.
pub fn await_shared(socket: &Path, n: usize, timeout: Duration) -> Result<(), String> {
    let t0 = Instant::now();
    loop {
        let seen = vrange_coordinator::query_all(socket)
            .map(|(_, _, regions)| regions.iter().filter(|r| r.volatile > 0).count());
        if seen.as_ref().is_ok_and(|&k| k >= n) {
            return Ok(());
        }
        if t0.elapsed() > timeout {
            return Err(format!(
                "{n} shared regions not held after {timeout:?}: {seen:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A coordinator running in a thread of the test process.
pub struct InProcess {
    pub shared: std::sync::Arc<vrange_coordinator::Shared>,
    thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl InProcess {
    pub fn start(opts: vrange_coordinator::Options) -> InProcess {
        let shared = std::sync::Arc::new(vrange_coordinator::Shared::default());
        let s = shared.clone();
        let thread = std::thread::spawn(move || vrange_coordinator::run(&opts, &s));
        InProcess {
            shared,
            thread: Some(thread),
        }
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.shared.stop.store(true, Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().expect("coordinator thread").expect("coordinator");
        }
    }
}

/// Parses a `REPORT` answer's purged bits.
pub fn purged_bits(r: &vrange_testkit::role::Reply) -> Vec<bool> {
    bits(r, "purged")
}

/// The purged bits of field `key` of a participant's report.
pub fn bits(r: &vrange_testkit::role::Reply, key: &str) -> Vec<bool> {
    r.str(key).chars().map(|c| c == '1').collect()
}
