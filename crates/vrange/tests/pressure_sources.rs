//! The pressure sources of `vrange_sys::pressure` against the real kernel: the waker, PSI
//! triggers (the window rule, and firing under real pressure), cgroup v1 vmpressure listeners,
//! and the poller's reporting of a source whose cgroup went away.
//!
//! # How pressure is made
//! A forked *thrasher* is moved into a fresh child memory cgroup limited to 64 MiB before it
//! allocates anything (v1 does not move charges with a process). It then fills 48 MiB of
//! anonymous memory, which reclaim cannot take (there is no swap), and writes and reads back a
//! 32 MiB unnamed file (O_TMPFILE in the target directory, a disk file system: tmpfs pages
//! would be anonymous too) over and over. The page cache has about 16 MiB to live in, so the
//! cgroup reclaims all the time, over pages that were just written (dirty) or just read
//! (referenced): it scans far more than it frees, which is what vmpressure calls medium or
//! critical, and the thrasher stalls in reclaim, which is what PSI counts.
//!
//! Every test holds `serial()`: the pressure tests must not overlap (their timings are the
//! point), and a fork must not inherit another test's descriptors.

use std::ffi::CStr;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use vrange_sys::cgroup::{unique_name, ChildCgroup, MemCgroup, Version};
use vrange_sys::pressure::{
    has_cap_sys_resource, psi_window_us, Headroom, Level, Poller, Propagation, PsiTrigger, Signal,
    VmPressure, Waker, PSI_UNPRIVILEGED_STEP_US, SYSTEM_PSI_FILE,
};
use vrange_testkit::fork::{fork_linked, Forked, Link};
use vrange_testkit::serial;
use vrange_testkit::thrash::{self, Failed, Thrash};

const MIB: usize = 1 << 20;
/// The child cgroup's hard limit.
const LIMIT: usize = 64 * MIB;
/// Anonymous memory the thrasher holds: reclaim cannot take it.
const ANON: usize = 48 * MIB;
/// The file the thrasher cycles through the page cache.
const FILE: usize = 32 * MIB;
/// Its unit of write and read.
const CHUNK: usize = MIB;
/// How long a thrasher runs at most; the tests kill it as soon as they have their answer.
const THRASH: Duration = Duration::from_secs(30);
/// Deadline for the hand-overs between test and thrasher.
const SYNC: Duration = Duration::from_secs(10);
/// How long a vmpressure listener may take to fire under the thrasher.
const VMPRESSURE_DEADLINE: Duration = Duration::from_secs(8);
/// How long a PSI trigger may take: the unprivileged aggregation runs every 2 s and a trigger
/// fires at most once per 2 s window, so two periods, plus the time an emulated guest on a busy
/// host may take to write the thrasher's file before its cgroup stalls at all. Within `THRASH`.
const PSI_DEADLINE: Duration = Duration::from_secs(20);

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

// ---- The thrasher ----

/// The thrasher's body (see the module documentation): waits for the word, then thrashes
/// (`vrange_testkit::thrash`) until `THRASH` is over. Only system calls: it runs in a fork of
/// a multi-threaded process.
fn thrash(link: &Link, dir: &CStr) -> i32 {
    if link.recv::<1>(SYNC).is_err() {
        return 3;
    }
    let t = Thrash {
        anon: ANON,
        file: FILE,
        chunk: CHUNK,
    };
    let deadline = Instant::now() + THRASH;
    let ready = || {
        let _ = link.send(&[1]);
    };
    match t.run(dir, ready, || Instant::now() < deadline) {
        Ok(()) => 0,
        Err(Failed::Map(_)) => 4,
        Err(Failed::File(_)) => 6,
        Err(Failed::Io(_)) => 7,
    }
}

/// A thrasher running in its own child memory cgroup; dropping it kills and reaps the
/// process, then removes the cgroup.
struct Thrasher {
    // Field order is drop order: the process goes first, so the cgroup is empty when removed.
    proc: Forked,
    _link: Link,
    cgroup: ChildCgroup,
    also: Option<PathBuf>,
    started: Instant,
    /// How often the thrasher ended early (OOM-killed at its limit) and was started again.
    restarts: u32,
}

/// A child memory cgroup for a thrasher, or why there can be none here.
fn thrasher_cgroup() -> Result<ChildCgroup, String> {
    vrange_testkit::cgroup::child("vrange-sources-", LIMIT as u64)
}

/// Forks a thrasher, moves it into `cgroup` (and into `also`, a v2 cgroup's directory, if
/// given), and lets it go once it is there; returns when it has filled its anonymous memory
/// and opened its file.
fn start_thrasher(cgroup: ChildCgroup, also: Option<&Path>) -> Thrasher {
    let (proc, link) = spawn_thrasher(&cgroup, also);
    Thrasher {
        proc,
        _link: link,
        cgroup,
        also: also.map(Path::to_path_buf),
        started: Instant::now(),
        restarts: 0,
    }
}

fn spawn_thrasher(cgroup: &ChildCgroup, also: Option<&Path>) -> (Forked, Link) {
    let dir = thrash::dir(Path::new(env!("CARGO_TARGET_TMPDIR")));
    let (proc, link) = fork_linked(|l| thrash(l, &dir));
    cgroup
        .add_pid(proc.pid())
        .expect("move the thrasher into the child cgroup");
    if let Some(v2) = also {
        fs::write(v2.join("cgroup.procs"), proc.pid().to_string())
            .expect("move the thrasher into the v2 cgroup");
    }
    assert!(link.send(&[1]), "thrasher gone before the start");
    match link.recv::<1>(SYNC) {
        Ok(_) => (proc, link),
        Err(e) => {
            let mut proc = proc;
            panic!(
                "thrasher did not start: {e:?}, {}",
                proc.wait(Duration::from_secs(1))
            );
        }
    }
}

impl Thrasher {
    /// Starts the thrasher again, in the same cgroups, if it ended before its time. At its
    /// limit the kernel may OOM-kill it: its file's pages are dirty, and an emulated guest's
    /// disk may write them back too slowly for reclaim. The pressure is the point, not the
    /// process, and a source must still fire once it is back.
    fn keep_going(&mut self) {
        if let Some(exit) = self.proc.try_ended() {
            println!(
                "thrasher ended with {exit} after {}; started again",
                ms(self.started.elapsed())
            );
            let (proc, link) = spawn_thrasher(&self.cgroup, self.also.as_deref());
            self.proc = proc;
            self._link = link;
            self.restarts += 1;
        }
    }
}

/// What the thrasher and its cgroups were doing (its state, and each cgroup's pressure,
/// events, usage and reclaim counters), for the report of a source that stayed silent.
fn thrashing_report(t: &Thrasher, also: Option<&Path>) -> String {
    let state = match vrange_sys::procfs::stat(Some(t.proc.pid() as u32)) {
        Ok(s) => s.state.to_string(),
        Err(e) if vrange_sys::procfs::is_gone(&e) => "gone".into(),
        Err(_) => "?".into(),
    };
    let mut out = format!(
        "thrasher state {state}, running for {:?}, started again {} times\n",
        t.started.elapsed(),
        t.restarts
    );
    let dirs = std::iter::once(t.cgroup.cgroup().path()).chain(also);
    for dir in dirs {
        out.push_str(&format!("  {}:\n", dir.display()));
        for name in [
            "memory.pressure",
            "memory.events",
            "memory.current",
            "memory.max",
            "memory.usage_in_bytes",
            "memory.limit_in_bytes",
            "memory.failcnt",
        ] {
            if let Ok(text) = fs::read_to_string(dir.join(name)) {
                out.push_str(&format!(
                    "    {name}: {}\n",
                    text.trim().replace('\n', "; ")
                ));
            }
        }
        let stat = fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
        let counters: Vec<&str> = stat
            .lines()
            .filter(|l| {
                [
                    "pgscan",
                    "pgsteal",
                    "workingset_refault",
                    "pgmajfault",
                    "file ",
                    "anon ",
                ]
                .iter()
                .any(|k| l.starts_with(k))
            })
            .collect();
        out.push_str(&format!("    memory.stat: {}\n", counters.join("; ")));
    }
    out
}

/// What a wait loop saw: each signal once, with when it was first seen and whether it came as
/// broken rather than fired.
type Seen = Vec<(Signal, Duration, bool)>;

fn saw(seen: &Seen, signal: Signal, broken: bool) -> bool {
    seen.iter().any(|&(s, _, b)| s == signal && b == broken)
}

/// Polls until `done(seen)` or `deadline`; adds to `seen` every signal first seen, with the
/// time since `since`. Calls `between` at least every `STEP` (to keep a thrasher going).
fn poll_until(
    poller: &mut Poller,
    seen: &mut Seen,
    since: Instant,
    deadline: Duration,
    mut between: impl FnMut(),
    mut done: impl FnMut(&Seen) -> bool,
) {
    const STEP: Duration = Duration::from_millis(200);
    let end = Instant::now() + deadline;
    while !done(seen) {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        let ready = poller.wait(Some(left.min(STEP))).expect("poll");
        for (set, broken) in [(ready.fired(), false), (ready.broken(), true)] {
            for s in set.iter() {
                if !saw(seen, s, broken) {
                    seen.push((s, since.elapsed(), broken));
                }
            }
        }
        between();
    }
}

fn describe(seen: &Seen) -> String {
    if seen.is_empty() {
        return "nothing".to_string();
    }
    seen.iter()
        .map(|(s, t, broken)| {
            format!(
                "{s:?}{} after {}",
                if *broken { " broken" } else { "" },
                ms(*t)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

// ---- 1. Waker ----

#[test]
fn waker_wakes_a_poller_from_another_thread() {
    let _serial = serial();
    let waker = Waker::new().unwrap();
    let mut poller = Poller::new();
    poller.add(waker.ident(), Signal::Wake).unwrap();

    let t0 = Instant::now();
    let timed_out = poller.wait(Some(Duration::from_millis(50))).unwrap();
    let waited = t0.elapsed();
    assert!(timed_out.is_empty(), "{timed_out:?}");
    assert!(
        waited >= Duration::from_millis(50),
        "returned after {waited:?}"
    );

    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(100));
            waker.wake();
        });
        let t0 = Instant::now();
        let ready = poller.wait(Some(Duration::from_secs(10))).unwrap();
        let latency = t0.elapsed();
        assert!(ready.contains(Signal::Wake), "{ready:?}");
        assert!(ready.broken().is_empty(), "{ready:?}");
        assert!(
            latency >= Duration::from_millis(90),
            "woke after {latency:?}"
        );
        println!(
            "waker: woke the poller {} after the wait began",
            ms(latency)
        );
    });

    // Drained: the same wake-up does not fire again.
    let again = poller.wait(Some(Duration::from_millis(20))).unwrap();
    assert!(again.is_empty(), "{again:?}");

    // Wakes before the wait are not lost, and coalesce into one.
    waker.wake();
    waker.wake();
    let ready = poller.wait(Some(Duration::ZERO)).unwrap();
    assert!(ready.contains(Signal::Wake), "{ready:?}");
    let again = poller.wait(Some(Duration::from_millis(20))).unwrap();
    assert!(again.is_empty(), "{again:?}");

    // Removed, the waker no longer wakes anything.
    assert_eq!(poller.remove(Signal::Wake), 1);
    waker.wake();
    assert!(poller.wait(Some(Duration::ZERO)).unwrap().is_empty());
}

// ---- 2. PSI trigger creation and the window rule ----

#[test]
fn psi_trigger_window_rule() {
    let _serial = serial();
    if !Path::new(SYSTEM_PSI_FILE).exists() {
        vrange_testkit::skip(format_args!(
            "{SYSTEM_PSI_FILE} is absent (kernel without PSI, or psi=0)"
        ));
        return;
    }
    let privileged = has_cap_sys_resource();
    println!(
        "psi: CAP_SYS_RESOURCE {}",
        if privileged { "present" } else { "absent" }
    );

    let two_s = PSI_UNPRIVILEGED_STEP_US;
    for (stall, window, full) in [
        (100_000, two_s, false),
        (100_000, two_s, true),
        (two_s, two_s, false),
        (1, 10_000_000, false),
    ] {
        let t = PsiTrigger::system(stall, window, full)
            .unwrap_or_else(|e| panic!("trigger {stall} {window} full={full}: {e}"));
        assert!(t.fd() >= 0);
        assert_eq!(
            (t.stall_us(), t.window_us(), t.full()),
            (stall, window, full)
        );
    }
    // Each trigger has its own open file, so several coexist.
    let a = PsiTrigger::system(100_000, two_s, false).unwrap();
    let b = PsiTrigger::system(100_000, two_s, false).unwrap();
    assert_ne!(a.fd(), b.fd());

    // Always invalid, whatever the privilege.
    for (stall, window) in [
        (100_000, 0),
        (100_000, 12_000_000),
        (0, two_s),
        (two_s + 1, two_s),
    ] {
        let e = PsiTrigger::system(stall, window, false).unwrap_err();
        assert_eq!(
            e.kind(),
            io::ErrorKind::InvalidInput,
            "{stall} {window}: {e}"
        );
    }
    // One second: a multiple of 2 s is required without CAP_SYS_RESOURCE only.
    match PsiTrigger::system(100_000, 1_000_000, false) {
        Ok(_) => assert!(privileged, "1 s window accepted without CAP_SYS_RESOURCE"),
        Err(e) => {
            assert!(
                !privileged,
                "1 s window rejected with CAP_SYS_RESOURCE: {e}"
            );
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
            assert!(e.to_string().contains("multiple of 2 s"), "{e}");
            println!("psi: 1 s window refused cleanly: {e}");
        }
    }
    // The kernel itself, without the module's checks in front: the rule documented in
    // vrange_sys::pressure, and the trailing NUL it needs.
    let raw = |text: &[u8]| -> Result<(), i32> {
        use std::io::Write;
        let mut f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(SYSTEM_PSI_FILE)
            .unwrap();
        f.write(text)
            .map(|_| ())
            .map_err(|e| e.raw_os_error().unwrap_or(0))
    };
    assert_eq!(raw(b"some 150000 2000000\0"), Ok(()));
    assert_eq!(raw(b"full 150000 10000000\0"), Ok(()));
    assert_eq!(raw(b"some 150000 12000000\0"), Err(libc::EINVAL));
    assert_eq!(raw(b"some 2000001 2000000\0"), Err(libc::EINVAL));
    let odd = raw(b"some 150000 3000000\0");
    // Without the NUL the last digit is lost: a 200 ms window.
    let no_nul = raw(b"some 150000 2000000");
    if privileged && vrange_testkit::procfs::kernel_version() >= (6, 4) {
        assert_eq!((odd, no_nul), (Ok(()), Ok(())));
    } else if privileged {
        // Before 6.4 a window had to be at least 500 ms.
        assert_eq!((odd, no_nul), (Ok(()), Err(libc::EINVAL)));
    } else {
        assert_eq!((odd, no_nul), (Err(libc::EINVAL), Err(libc::EINVAL)));
    }

    // What psi_window_us suggests is accepted.
    for wish in [1, 1_000_000, 3_000_000, 20_000_000] {
        let w = psi_window_us(wish);
        PsiTrigger::system(w.min(100_000), w, false)
            .unwrap_or_else(|e| panic!("window {w} (for {wish}): {e}"));
    }

    // v1 has no cgroup PSI file; v2 may.
    if let Some(cg) = MemCgroup::current() {
        let r = PsiTrigger::cgroup(&cg, 100_000, two_s, false);
        match cg.version() {
            Version::V1 => {
                assert_eq!(r.unwrap_err().kind(), io::ErrorKind::Unsupported);
            }
            Version::V2 => {
                if cg.pressure_file().is_some() {
                    r.unwrap();
                }
            }
        }
    }
}

// ---- 3. vmpressure under real pressure ----

#[test]
fn vmpressure_fires_under_cgroup_pressure() {
    let _serial = serial();
    let cgroup = match thrasher_cgroup() {
        Ok(c) => c,
        Err(why) => {
            vrange_testkit::skip(format_args!("{why}"));
            return;
        }
    };
    if cgroup.cgroup().version() != Version::V1 {
        let e = VmPressure::register(cgroup.cgroup(), Level::Medium).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Unsupported, "{e}");
        return vrange_testkit::skip_lacking(
            "a cgroup v1 memory controller",
            vrange_testkit::cgroup::v1_lacking(),
            "vmpressure needs cgroup v1; this is v2",
        );
    }
    let cg = cgroup.cgroup().clone();
    let medium = VmPressure::register(&cg, Level::Medium).expect("register medium");
    let critical = VmPressure::register(&cg, Level::Critical).expect("register critical");
    assert!(!medium.is_stale() && !critical.is_stale());
    // Low stays out of the poller (that is the point of it); it only counts events. The other
    // propagation modes must be accepted too.
    let low = VmPressure::register_with(&cg, Level::Low, Propagation::Local).expect("low, local");
    VmPressure::register_with(&cg, Level::Critical, Propagation::Hierarchy)
        .expect("critical, hierarchy");
    let mut poller = Poller::new();
    poller.add(medium.ident(), medium.signal()).unwrap();
    poller.add(critical.ident(), critical.signal()).unwrap();

    // Headroom of an idle 64 MiB cgroup: nearly all of it.
    let headroom = Headroom::new(&cg).unwrap().expect("the child has a limit");
    assert_eq!(headroom.ceiling(), LIMIT as u64);
    assert!(headroom.bytes().unwrap() > (LIMIT - 4 * MIB) as u64);
    assert_eq!(cg.headroom(), Some(headroom.bytes().unwrap()));

    // No pressure yet: nothing fires.
    let quiet = poller.wait(Some(Duration::from_millis(100))).unwrap();
    assert!(quiet.is_empty(), "{quiet:?} before any pressure");

    let mut thrasher = start_thrasher(cgroup, None);
    let filled = thrasher.started.elapsed();
    let room = headroom.bytes().unwrap();
    let mut seen = Seen::new();
    let started = thrasher.started;
    poll_until(
        &mut poller,
        &mut seen,
        started,
        VMPRESSURE_DEADLINE,
        || thrasher.keep_going(),
        |seen| {
            saw(seen, Signal::VmpressureMedium, false)
                || saw(seen, Signal::VmpressureCritical, false)
        },
    );
    // Event rates over one second of thrashing: every eventfd counts its events meanwhile.
    let _ = (
        low.take_events(),
        medium.take_events(),
        critical.take_events(),
    );
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let secs = t0.elapsed().as_secs_f64();
    let rate = |v: &VmPressure| v.take_events() as f64 / secs;
    let (low_rate, medium_rate, critical_rate) = (rate(&low), rate(&medium), rate(&critical));
    println!(
        "vmpressure: thrasher filled {} MiB in {}, headroom then {} KiB; seen: {}; then events \
         per second: low {low_rate:.0}, medium {medium_rate:.0}, critical {critical_rate:.0}",
        ANON / MIB,
        ms(filled),
        room / 1024,
        describe(&seen)
    );
    assert!(
        saw(&seen, Signal::VmpressureMedium, false)
            || saw(&seen, Signal::VmpressureCritical, false),
        "no medium or critical vmpressure event within {VMPRESSURE_DEADLINE:?}: {}",
        describe(&seen)
    );
    assert!(!medium.is_stale());
    // Low fires for every level, so at least as often as the others.
    assert!(
        low_rate >= medium_rate,
        "low {low_rate}/s, medium {medium_rate}/s"
    );

    // Removing the cgroup signals the listeners once; is_stale tells that from pressure.
    let Thrasher { proc, cgroup, .. } = thrasher;
    drop(proc);
    // Let the last pressure events drain before removal.
    while !poller
        .wait(Some(Duration::from_millis(200)))
        .unwrap()
        .is_empty()
    {}
    vrange_testkit::cgroup::remove(cgroup);
    assert!(medium.is_stale() && critical.is_stale());
    let t0 = Instant::now();
    let last = poller.wait(Some(Duration::from_secs(2))).unwrap();
    println!(
        "vmpressure: after removing the cgroup the listeners reported {:?} within {}",
        last.fired(),
        ms(t0.elapsed())
    );
}

/// The reclaimer's listener (`register_own`) hears reclaim aimed at its own cgroup only: a
/// child cgroup thrashing at its own limit reaches a default listener on the parent (nobody
/// below handles it), never the parent's own one, since purging the parent's memory would not
/// relieve the child.
#[test]
fn own_vmpressure_ignores_a_child_cgroups_pressure() {
    let _serial = serial();
    let parent = match vrange_testkit::cgroup::current_v1("vmpressure propagation") {
        Ok(p) => p,
        Err(why) => {
            return vrange_testkit::skip_lacking(
                "a cgroup v1 memory controller",
                vrange_testkit::cgroup::v1_lacking(),
                why,
            )
        }
    };
    let cgroup = match thrasher_cgroup() {
        Ok(c) => c,
        Err(why) => return vrange_testkit::skip(why),
    };
    // Low: every event, so the propagated count is large where there is any.
    let own = VmPressure::register_own(&parent, Level::Low).expect("register own");
    let propagated = VmPressure::register(&parent, Level::Low).expect("register default");
    // Reclaim elsewhere before the thrasher (another cgroup's) counts for neither.
    let (_, _) = (own.take_events(), propagated.take_events());
    let mut thrasher = start_thrasher(cgroup, None);
    let mut heard = 0;
    while heard < 10 && thrasher.started.elapsed() < VMPRESSURE_DEADLINE {
        std::thread::sleep(Duration::from_millis(50));
        thrasher.keep_going();
        heard += propagated.take_events();
    }
    let own_heard = own.take_events();
    println!(
        "vmpressure on the parent {}: default listener {heard} events, own listener \
         {own_heard}",
        parent.path().display()
    );
    let Thrasher { proc, cgroup, .. } = thrasher;
    drop(proc);
    vrange_testkit::cgroup::remove(cgroup);
    assert!(
        heard > 0,
        "the child's pressure never reached the parent's default listener within \
         {VMPRESSURE_DEADLINE:?}"
    );
    assert_eq!(
        own_heard, 0,
        "the parent's own listener heard the child's pressure"
    );
}

// ---- 4. PSI under real pressure, and a cgroup trigger that breaks ----

/// A v2 cgroup made by a test in a hybrid setup (v2 without the memory controller still has
/// PSI files); removed on drop after moving its processes out.
struct V2Cgroup {
    dir: PathBuf,
}

impl V2Cgroup {
    /// A new v2 cgroup below this process's v2 cgroup, or why there is none.
    fn create() -> Result<V2Cgroup, String> {
        let parent = vrange_sys::cgroup::v2_dir()
            .ok_or("no cgroup2 mount, or no v2 line in /proc/self/cgroup")?;
        let dir = parent.join(unique_name("vrange-psi-"));
        fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let cg = V2Cgroup { dir };
        if !cg.dir.join("memory.pressure").exists() {
            return Err(format!("{} has no memory.pressure", cg.dir.display()));
        }
        Ok(cg)
    }

    fn remove(&self) -> io::Result<()> {
        let parent_procs = self.dir.parent().unwrap().join("cgroup.procs");
        let mut last = Ok(());
        for _ in 0..100 {
            if let Ok(procs) = fs::read_to_string(self.dir.join("cgroup.procs")) {
                for pid in procs.split_whitespace() {
                    let _ = fs::write(&parent_procs, pid);
                }
            }
            match fs::remove_dir(&self.dir) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) => last = Err(e),
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        last
    }
}

impl Drop for V2Cgroup {
    fn drop(&mut self) {
        if let Err(e) = self.remove() {
            eprintln!("left cgroup {} behind: {e}", self.dir.display());
        }
    }
}

#[test]
fn psi_triggers_fire_under_pressure() {
    let _serial = serial();
    if !Path::new(SYSTEM_PSI_FILE).exists() {
        vrange_testkit::skip(format_args!(
            "{SYSTEM_PSI_FILE} is absent (kernel without PSI, or psi=0)"
        ));
        return;
    }
    let cgroup = match thrasher_cgroup() {
        Ok(c) => c,
        Err(why) => {
            vrange_testkit::skip(format_args!("{why}"));
            return;
        }
    };
    let window = psi_window_us(2_000_000);
    // 50 ms of stall in a 2 s window: an idle machine stays far below, the thrasher far above.
    let stall = 50_000;
    let system = PsiTrigger::system(stall, window, false).expect("system PSI trigger");
    // The cgroup trigger: on the memory cgroup itself where it is v2, else on a v2 cgroup made
    // for the purpose (hybrid setups).
    let mut v2 = None;
    let cgroup_trigger = if cgroup.cgroup().version() == Version::V2 {
        PsiTrigger::cgroup(cgroup.cgroup(), stall, window, false).ok()
    } else {
        match V2Cgroup::create() {
            Ok(made) => {
                let t = PsiTrigger::file(&made.dir.join("memory.pressure"), stall, window, false)
                    .expect("PSI trigger on a v2 cgroup");
                v2 = Some(made);
                Some(t)
            }
            Err(why) => {
                println!("psi: no cgroup trigger: {why}");
                None
            }
        }
    };
    let mut poller = Poller::new();
    poller.add(system.ident(), Signal::PsiSystem).unwrap();
    if let Some(t) = &cgroup_trigger {
        poller.add(t.ident(), Signal::PsiCgroup).unwrap();
    }

    let before = fs::read_to_string(SYSTEM_PSI_FILE).unwrap();
    let mut thrasher = start_thrasher(cgroup, v2.as_ref().map(|c| c.dir.as_path()));
    let want_cgroup = cgroup_trigger.is_some();
    let mut seen = Seen::new();
    let started = thrasher.started;
    poll_until(
        &mut poller,
        &mut seen,
        started,
        PSI_DEADLINE,
        || thrasher.keep_going(),
        |seen| {
            saw(seen, Signal::PsiSystem, false)
                && (!want_cgroup || saw(seen, Signal::PsiCgroup, false))
        },
    );
    let after = fs::read_to_string(SYSTEM_PSI_FILE).unwrap();
    println!(
        "psi: window {window} us, stall {stall} us; seen: {}\n  before: {}\n  after:  {}",
        describe(&seen),
        before.lines().next().unwrap_or(""),
        after.lines().next().unwrap_or("")
    );
    let fired = saw(&seen, Signal::PsiSystem, false)
        && (!want_cgroup || saw(&seen, Signal::PsiCgroup, false));
    let story = if fired {
        String::new()
    } else {
        thrashing_report(&thrasher, v2.as_ref().map(|c| c.dir.as_path()))
    };
    assert!(
        saw(&seen, Signal::PsiSystem, false),
        "system trigger silent: {}\n{story}",
        describe(&seen)
    );
    if want_cgroup {
        assert!(
            saw(&seen, Signal::PsiCgroup, false),
            "cgroup trigger silent: {}\n{story}",
            describe(&seen)
        );
    }

    // Removing the v2 cgroup breaks its trigger: POLLERR, reported as broken and dropped.
    let Thrasher { proc, cgroup, .. } = thrasher;
    drop(proc);
    drop(cgroup);
    if let Some(made) = v2.take() {
        made.remove().expect("remove the v2 cgroup");
        let mut seen = Seen::new();
        poll_until(
            &mut poller,
            &mut seen,
            Instant::now(),
            Duration::from_secs(3),
            || {},
            |seen| saw(seen, Signal::PsiCgroup, true),
        );
        println!("psi: after removing the v2 cgroup: {}", describe(&seen));
        assert!(
            saw(&seen, Signal::PsiCgroup, true),
            "removed cgroup's trigger not reported broken: {}",
            describe(&seen)
        );
        assert_eq!(poller.len(), 1, "broken source still in the poller");
    }
}

// ---- 5. The reclaimer and another cgroup's trouble ----

/// Regression: the system's PSI file counts stalls of every cgroup, so a neighbour thrashing at
/// its own limit made every vrange process on the machine purge `VRANGE_PRESSURE_SHARE` of its
/// volatile memory, though the machine had plenty. The reclaimer now answers the system
/// trigger only while the machine itself is short (MemAvailable under a tenth of MemTotal).
/// The thrasher runs in a v2 cgroup of its own where there is one, so this process's v2
/// `memory.pressure` (another source) does not count its stalls either.
#[test]
fn a_neighbour_cgroup_thrashing_at_its_limit_purges_nothing_here() {
    use vrange::{Options, Policy, Source, VolatileRegion};
    let _serial = serial();
    let cgroup = match thrasher_cgroup() {
        Ok(c) => c,
        Err(why) => {
            vrange_testkit::skip(format_args!("{why}"));
            return;
        }
    };
    let (total, avail) = vrange_sys::procfs::mem_available_kb()
        .expect("read /proc/meminfo")
        .expect("MemAvailable");
    assert!(
        avail > total / 5,
        "the machine itself is short ({avail} of {total} KiB available): this test needs room"
    );
    // Only the system PSI trigger listens, and it fires on a small stall.
    for (k, v) in [
        ("VRANGE_PSI", "some 10000 2000000"),
        ("VRANGE_VMPRESSURE", "off"),
        ("VRANGE_HEADROOM", "0"),
        ("VRANGE_POLL_MS", "20"),
    ] {
        vrange::set_option(k, v).unwrap();
    }
    let region = VolatileRegion::new(
        32 * MIB,
        Options {
            policy: Policy::Managed,
            ..Options::default()
        },
    )
    .expect("region");
    // SAFETY: the region is ours, and no reference into it lives across the mark.
    unsafe {
        region.as_ptr().write_bytes(0x5a, region.len());
        region.mark().expect("mark");
    }
    let before = *vrange::stats().source(Source::Psi);
    // Let the reclaimer open its sources (a tick after volatile memory appears).
    let opened = Instant::now();
    while !vrange::reclaimer::active_sources().contains(&Source::Psi) {
        assert!(
            opened.elapsed() < SYNC,
            "the reclaimer never opened its system PSI trigger: {:?}",
            vrange::reclaimer::active_sources()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // On a hybrid host, a v2 cgroup of its own as well; on pure v2 its memory cgroup is one.
    let v2 = (cgroup.cgroup().version() == Version::V1)
        .then(|| V2Cgroup::create().ok())
        .flatten();
    let mut thrasher = start_thrasher(cgroup, v2.as_ref().map(|c| c.dir.as_path()));
    let mut fired = 0;
    while fired == 0 && thrasher.started.elapsed() < PSI_DEADLINE {
        std::thread::sleep(Duration::from_millis(50));
        thrasher.keep_going();
        fired = vrange::stats().source(Source::Psi).events - before.events;
    }
    let after = *vrange::stats().source(Source::Psi);
    let Thrasher { proc, cgroup, .. } = thrasher;
    drop(proc);
    vrange_testkit::cgroup::remove(cgroup);
    if let Some(v2) = v2 {
        let _ = v2.remove();
    }
    let report = region.unmark().expect("unmark");
    for (k, v) in [
        ("VRANGE_PSI", "some 100000 2000000"),
        ("VRANGE_VMPRESSURE", "on"),
        ("VRANGE_HEADROOM", "auto"),
        ("VRANGE_POLL_MS", "100"),
    ] {
        vrange::set_option(k, v).unwrap();
    }
    assert!(
        fired > 0,
        "the system PSI trigger never fired within {PSI_DEADLINE:?} of the neighbour's thrashing"
    );
    assert_eq!(
        after.bytes - before.bytes,
        0,
        "system PSI purged for another cgroup's stall ({fired} events)"
    );
    assert!(!report.was_purged(), "the volatile region was purged");
}
