//! Managed and hybrid regions under real memory pressure in a child memory cgroup: the
//! reclaimer (and, for hybrid ranges, the kernel) must free enough volatile memory that a
//! memory hog fits, and every unmark must still report exactly what was lost.
//!
//! # Design
//! Each process is a fresh execution of this test binary (see `vrange_testkit::role`): the
//! harness is multi-threaded, and each role needs a reclaimer of its own and must be in the
//! child cgroup before it allocates anything (cgroup v1 does not move charges with a process).
//! The test process creates the child cgroup and spawns, each joining the cgroup between fork
//! and exec (`vrange_sys::cgroup::join_before_exec`):
//!
//! 1. the *holder*, which sets its options, maps `REGIONS` regions of `REGION` bytes, fills
//!    each with its own pattern, marks `VOLATILE_REGIONS` of them volatile (64 MiB) and keeps
//!    the others pinned (32 MiB), waits until `vrange::stats()` shows the volatile ones in the
//!    expected state (hybrid: all armed, i.e. handed to the kernel's lazy-free path) and says
//!    READY;
//! 2. the *hog*, which touches `LIMIT - usage + MUST_FREE` bytes of fresh memory (small
//!    pages) and exits: pinned memory plus the hog fit under the limit with 32 MiB to spare,
//!    volatile memory too is `MUST_FREE` (plus the hog's own runtime) over it. There is no
//!    swap, so the hog survives only if at least that much volatile memory is freed: by the
//!    kernel (armed hybrid pages) or by the holder's reclaimer (whole ranges). The hog sets its
//!    `oom_score_adj` to 1000 so that if the limit is ever exceeded, it is the one killed.
//!
//! When the hog is gone, the test tells the holder to check: it unmarks every region, reads
//! every page (all zero, exactly its pattern, or corrupted), compares the zero pages with the
//! reported purge count, and reports the counts and its `vrange::stats()`, per source.
//!
//! `hybrid_under_fast_pressure_hog_survives_and_reports_exactly` touches the hog's memory in
//! one go: the kernel's direct reclaim meets the pressure first, and races the holder's
//! reclaimer, which its vmpressure events (or its headroom poll) wake: the kernel discards
//! armed pages one by one, the reclaimer whole ranges. Whoever wins, unmark must be exact.
//! `hybrid_under_fast_pressure_kernel_alone_reports_exactly` turns the holder's pressure
//! sources off (its reclaimer only arms), so the kernel alone must discard the pages.
//! `managed_under_slow_pressure_reclaimer_alone_prevents_oom` grows the hog 1 MiB at a time
//! over managed regions, which the kernel cannot reclaim at all (no MADV_FREE, no swap): only
//! the reclaimer can make room; its control run, with the reclaimer off, must end in an OOM
//! kill.

use std::fmt::Write as _;
use std::time::{Duration, Instant};
use vrange::{page_size, Huge, Options, Policy, Priority, Source, Stats, VolatileRegion};
use vrange_sys::cgroup::{join_before_exec, ChildCgroup, MemCgroup};
use vrange_sys::procfs;
use vrange_testkit::cgroup::{self, peak};
use vrange_testkit::hog;
use vrange_testkit::pattern::{check, check_at, fill, is_zero};
use vrange_testkit::proc::Exit;
use vrange_testkit::procfs::vmstat;
use vrange_testkit::role::{command, role, role_command, say, Reply, Role};
use vrange_testkit::serial;

const MIB: usize = 1 << 20;
/// The child cgroup's hard limit.
const LIMIT: usize = 160 * MIB;
/// The holder's regions: `VOLATILE_REGIONS` volatile, the rest pinned.
const REGION: usize = 4 * MIB;
const REGIONS: usize = 24;
const VOLATILE_REGIONS: usize = 16;
const VOLATILE_BYTES: usize = VOLATILE_REGIONS * REGION;
const PINNED_BYTES: usize = (REGIONS - VOLATILE_REGIONS) * REGION;
/// What the hog's allocation exceeds the limit by, given the cgroup's usage when the holder is
/// ready (the hog's own runtime comes on top).
const MUST_FREE: usize = 32 * MIB;
/// Hybrid ranges are armed this long after marking.
const ARM_DELAY_MS: u64 = 200;
/// The managed holder's reclaimer polls headroom this often.
const POLL_MS: u64 = 20;
/// The slow hog's step and pause.
const SLOW_STEP: usize = MIB;
const SLOW_PAUSE: Duration = Duration::from_millis(15);
/// Setups tried before giving up when something purges before the pressure (see [`run`]).
const ATTEMPTS: usize = 3;
/// Deadlines: the holder's wait for its ranges to settle, each hand-over, the hog's run.
const SETTLE: Duration = Duration::from_secs(10);
const SYNC: Duration = Duration::from_secs(20);
const HOG_DEADLINE: Duration = Duration::from_secs(30);

const HYBRID_TEST: &str = "hybrid_under_fast_pressure_hog_survives_and_reports_exactly";
const KERNEL_TEST: &str = "hybrid_under_fast_pressure_kernel_alone_reports_exactly";
const MANAGED_TEST: &str = "managed_under_slow_pressure_reclaimer_alone_prevents_oom";

/// Role and environment names (see `vrange_testkit::role`).
const HYBRID_HOLDER: &str = "hybrid-holder";
const MANAGED_HOLDER: &str = "managed-holder";
const HOG: &str = "hog";
const HOG_BYTES_ENV: &str = "VRANGE_TEST_HOG_BYTES";
const HOG_STEP_ENV: &str = "VRANGE_TEST_HOG_STEP";
const HOG_PAUSE_ENV: &str = "VRANGE_TEST_HOG_PAUSE_US";

fn volatile(i: usize) -> bool {
    // Pinned: 0, 3, 6, ... (8 of 24), so both page sizes hold pinned and volatile regions.
    i % 3 != 0
}

fn huge(i: usize) -> Huge {
    // Half the regions may get transparent huge pages (THP is `madvise` here, and the library
    // advises it for regions of 2 MiB or more), half never do.
    if i % 2 == 0 {
        Huge::Never
    } else {
        Huge::Auto
    }
}

fn seed(i: usize) -> u64 {
    1000 + i as u64
}

fn ms(ns: u64) -> String {
    format!("{:.1}", ns as f64 / 1e6)
}

// ---- Roles ----

/// Plays the role this process was started for.
fn play(role: &str) {
    match role {
        HYBRID_HOLDER => holder(Policy::Hybrid),
        MANAGED_HOLDER => holder(Policy::Managed),
        HOG => hog(),
        other => panic!("unknown role {other:?}"),
    }
}

fn env_u64(name: &str) -> u64 {
    let v = std::env::var(name).unwrap_or_else(|_| panic!("{name} not set"));
    v.parse()
        .unwrap_or_else(|_| panic!("{name}={v:?} is not a number"))
}

/// The hog: touches `HOG_BYTES_ENV` bytes of fresh small pages, `HOG_STEP_ENV` bytes at a time
/// with `HOG_PAUSE_ENV` µs between steps, then exits normally.
fn hog() {
    hog::prefer_oom_kill().expect("write oom_score_adj");
    let (bytes, step, pause) = (
        env_u64(HOG_BYTES_ENV) as usize,
        env_u64(HOG_STEP_ENV) as usize,
        Duration::from_micros(env_u64(HOG_PAUSE_ENV)),
    );
    let started = Instant::now();
    hog::touch(bytes, step, pause).expect("map the hog's memory");
    say(format_args!(
        "HOG touched={bytes} ms={}",
        started.elapsed().as_millis()
    ));
}

/// What the holder found in one volatile region.
struct RegionCheck {
    purged: usize,
    zero: usize,
    intact: usize,
    bad: usize,
}

/// Unmarks a volatile region and classifies every page.
fn check_volatile(r: &VolatileRegion, seed: u64) -> (vrange::Unmarked, RegionCheck) {
    let page = page_size();
    let u = r.unmark().expect("unmark a volatile region");
    let mut c = RegionCheck {
        purged: u.purged,
        zero: 0,
        intact: 0,
        bad: 0,
    };
    for off in (0..r.len()).step_by(page) {
        let p = r.as_ptr().wrapping_add(off);
        if is_zero(p, page) {
            c.zero += 1;
        } else if check_at(r.as_ptr(), off, page, seed) {
            c.intact += 1;
        } else {
            c.bad += 1;
        }
    }
    (u, c)
}

/// Reports the holder's statistics, one line per source that fired.
fn say_stats(s: &Stats) {
    for src in Source::ALL {
        let c = s.source(src);
        if c.events == 0 {
            continue;
        }
        say(format_args!(
            "SOURCE name={} events={} ranges={} bytes={} purging_events={} last_ns={} \
             max_ns={} total_ns={}",
            src.name(),
            c.events,
            c.ranges,
            c.bytes,
            c.purging_events,
            c.reaction_last_ns,
            c.reaction_max_ns,
            c.reaction_total_ns
        ));
    }
    say(format_args!(
        "STATS purged_total={} armed_total={} losses={} reclaimer_running={} volatile={} \
         armed={} purged={}",
        s.purged_total_bytes,
        s.armed_total_bytes,
        s.losses_reported,
        u8::from(s.reclaimer_running),
        s.volatile_bytes,
        s.armed_bytes,
        s.purged_bytes
    ));
}

/// The holder (see the module documentation).
fn holder(policy: Policy) {
    // Options first: the reclaimer starts with the first region. The control run disables the
    // reclaimer through the environment (VRANGE_RECLAIMER=off), which these do not change.
    match policy {
        Policy::Hybrid => {
            vrange::set_option("VRANGE_ARM_DELAY_MS", &ARM_DELAY_MS.to_string()).unwrap()
        }
        _ => vrange::set_option("VRANGE_POLL_MS", &POLL_MS.to_string()).unwrap(),
    }
    let regions: Vec<VolatileRegion> = (0..REGIONS)
        .map(|i| {
            let opts = Options {
                policy,
                priority: Priority::Normal,
                shared: false,
                huge: huge(i),
                sigbus: false,
            };
            let r = VolatileRegion::new(REGION, opts).expect("create a region");
            fill(r.as_ptr(), r.len(), seed(i));
            r
        })
        .collect();
    let marked = Instant::now();
    for (i, r) in regions.iter().enumerate() {
        if volatile(i) {
            // SAFETY: no reference into the region is held until it is unmarked below.
            unsafe { r.mark() }.expect("mark");
        }
    }
    // Wait until every volatile range is where the test needs it (hybrid: armed), or purged
    // already (which the test reports as a failure: nothing should purge before the hog).
    let deadline = marked + SETTLE;
    let s = loop {
        let s = vrange::stats();
        let settled = match policy {
            Policy::Hybrid if s.reclaimer_running => {
                s.armed_ranges + s.purged_ranges == VOLATILE_REGIONS as u64
                    && s.armed_bytes + s.purged_bytes == VOLATILE_BYTES as u64
            }
            _ => s.volatile_bytes + s.purged_bytes == VOLATILE_BYTES as u64,
        };
        if settled || Instant::now() > deadline {
            break s;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let early: Vec<String> = Source::ALL
        .into_iter()
        .filter(|&src| s.source(src).events > 0)
        .map(|src| {
            format!(
                "{}:{}:{}",
                src.name(),
                s.source(src).events,
                s.source(src).bytes
            )
        })
        .collect();
    let sources: Vec<&str> = vrange::reclaimer::active_sources()
        .into_iter()
        .map(Source::name)
        .collect();
    let cgroup = MemCgroup::current().map(|c| c.path().display().to_string());
    say(format_args!(
        "READY cgroup={} volatile={} armed={} pinned={} purged={} early={} \
         reclaimer_running={} sources={} settle_ms={}",
        cgroup.as_deref().unwrap_or("none"),
        s.volatile_bytes,
        s.armed_bytes,
        s.pinned_bytes,
        s.purged_bytes,
        if early.is_empty() {
            "none".to_string()
        } else {
            early.join(",")
        },
        u8::from(s.reclaimer_running),
        if sources.is_empty() {
            "none".to_string()
        } else {
            sources.join(",")
        },
        marked.elapsed().as_millis()
    ));
    match command().as_deref() {
        Some("check") => {}
        other => panic!("holder: expected check, got {other:?}"),
    }
    let page = page_size();
    let (mut v_pages, mut v_volatile, mut purged, mut zero, mut intact, mut bad) =
        (0, 0, 0, 0, 0, 0);
    let (mut inexact, mut whole, mut partial, mut bad_pinned, mut pinned_reported) =
        (0, 0, 0, 0, 0);
    for (i, r) in regions.iter().enumerate() {
        if !volatile(i) {
            let u = r.unmark().expect("unmark a pinned region");
            pinned_reported += u.volatile + u.purged;
            bad_pinned += usize::from(!check(r.as_ptr(), r.len(), seed(i)));
            continue;
        }
        let (u, c) = check_volatile(r, seed(i));
        say(format_args!(
            "REGION i={i} huge={} pages={} volatile={} purged={} zero={} intact={} bad={}",
            u8::from(huge(i) == Huge::Auto),
            u.pages,
            u.volatile,
            c.purged,
            c.zero,
            c.intact,
            c.bad
        ));
        v_pages += u.pages;
        v_volatile += u.volatile;
        purged += c.purged;
        zero += c.zero;
        intact += c.intact;
        bad += c.bad;
        inexact += usize::from(c.zero != c.purged);
        whole += usize::from(c.purged == r.len() / page);
        partial += usize::from(c.purged > 0 && c.purged < r.len() / page);
    }
    // The counters after unmarking (losses are counted by unmark); nothing purges meanwhile:
    // the hog is gone.
    say_stats(&vrange::stats());
    say(format_args!(
        "VERDICT pages={v_pages} volatile={v_volatile} purged={purged} zero={zero} \
         intact={intact} bad={bad} inexact={inexact} whole={whole} partial={partial} \
         bad_pinned={bad_pinned} pinned_reported={pinned_reported}"
    ));
    drop(regions);
    vrange::reclaimer::stop();
}

// ---- The test process ----

fn mib(bytes: Option<u64>) -> String {
    bytes.map_or("?".into(), |b| format!("{:.1} MiB", b as f64 / MIB as f64))
}

/// How a run is set up.
#[derive(Debug, Clone, Copy)]
struct Setup {
    test: &'static str,
    policy: Policy,
    /// The hog's step (`usize::MAX`: all at once) and pause between steps.
    step: usize,
    pause: Duration,
    /// Holder started with VRANGE_RECLAIMER=off.
    reclaimer_off: bool,
    /// Holder started with every pressure source off (VRANGE_PSI, VRANGE_VMPRESSURE and
    /// VRANGE_HEADROOM off): its reclaimer thread only arms hybrid ranges.
    sources_off: bool,
}

/// Counters of one source as the holder reported them.
#[derive(Debug, Clone)]
struct SourceLine {
    name: String,
    events: u64,
    ranges: u64,
    bytes: u64,
    purging_events: u64,
    last_ns: u64,
    max_ns: u64,
    total_ns: u64,
}

/// What a run found.
struct Outcome {
    ready: Reply,
    usage_ready: u64,
    /// Lazy-free pages the kernel discarded while the hog ran (system-wide /proc/vmstat).
    lazyfreed: Option<u64>,
    /// The holder's LazyFree when ready, summed VMA by VMA.
    lazy_free_kb: u64,
    /// The holder's VMAs of 1 MiB resident or more when ready (kB: rss, huge, lazy).
    vma_list: String,
    hog_bytes: u64,
    hog: Exit,
    hog_reply: Option<Reply>,
    hog_ms: u128,
    oom_before: u64,
    oom_after: u64,
    peak: Option<u64>,
    holder_exit: Exit,
    regions: Vec<Reply>,
    sources: Vec<SourceLine>,
    stats: Option<Reply>,
    verdict: Option<Reply>,
    elapsed: Duration,
    /// The holder's output, for failure messages.
    diagnostics: String,
}

impl Outcome {
    fn source_bytes(&self, names: &[&str]) -> u64 {
        self.sources
            .iter()
            .filter(|s| names.contains(&s.name.as_str()))
            .map(|s| s.bytes)
            .sum()
    }

    fn report(&self, label: &str) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{label}: limit {} MiB; usage when ready {}; holder LazyFree {} kB; hog {} \
             ({}) in {} ms, ended with {}; meanwhile the kernel discarded {} of lazy-free pages \
             (system-wide pglazyfreed); peak {}; oom_kills {} -> {}; holder ended with {}; \
             run {} ms",
            LIMIT / MIB,
            mib(Some(self.usage_ready)),
            self.lazy_free_kb,
            mib(Some(self.hog_bytes)),
            self.hog_reply
                .as_ref()
                .map_or("no report".to_string(), |r| format!(
                    "touched {} in {} ms",
                    mib(Some(r.u64("touched"))),
                    r.str("ms")
                )),
            self.hog_ms,
            self.hog,
            mib(self.lazyfreed.map(|p| p * page_size() as u64)),
            mib(self.peak),
            self.oom_before,
            self.oom_after,
            self.holder_exit,
            self.elapsed.as_millis()
        );
        let _ = writeln!(out, "{label}: holder ready: {:?}", self.ready.fields);
        if let Some(v) = &self.verdict {
            let _ = writeln!(out, "{label}: verdict: {:?}", v.fields);
        }
        if let Some(s) = &self.stats {
            let _ = writeln!(out, "{label}: stats: {:?}", s.fields);
        }
        for s in &self.sources {
            let mean = s.total_ns.checked_div(s.purging_events).unwrap_or(0);
            let _ = writeln!(
                out,
                "{label}: source {}: {} events, {} purging, {} ranges, {} purged; reaction \
                 last {} ms, max {} ms, mean {} ms",
                s.name,
                s.events,
                s.purging_events,
                s.ranges,
                mib(Some(s.bytes)),
                ms(s.last_ns),
                ms(s.max_ns),
                ms(mean)
            );
        }
        let per_region: Vec<String> = self
            .regions
            .iter()
            .map(|r| {
                format!(
                    "{}{}:{}",
                    r.str("i"),
                    if r.str("huge") == "1" { "h" } else { "" },
                    r.str("purged")
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "{label}: purged pages per volatile region (h: THP allowed): {}",
            per_region.join(" ")
        );
        out
    }
}

/// Runs the holder and the hog in a fresh child cgroup. `None` (with a printed reason) if this
/// environment cannot create one.
///
/// The setup is repeated (at most `ATTEMPTS` times, each in a fresh cgroup) if anything purged
/// volatile memory before the hog started: the system-wide PSI trigger reacts to memory
/// stalls anywhere on the machine (other tests, other users), and a purge before the pressure
/// would leave less volatile memory than the scenario needs. Such retries are printed.
fn run(s: Setup) -> Option<Outcome> {
    let parent = match cgroup::parent() {
        Ok(parent) => parent,
        Err(why) => {
            vrange_testkit::skip(why);
            return None;
        }
    };
    let mut disturbed = Vec::new();
    for _ in 0..ATTEMPTS {
        let child = match cgroup::child_of(&parent, "vrange-managed-", LIMIT as u64) {
            Ok(child) => child,
            Err(why) => {
                vrange_testkit::skip(why);
                return None;
            }
        };
        match attempt(&s, child) {
            Ok(out) => return Some(out),
            Err(why) => {
                println!("{}: setup disturbed, retrying: {why}", s.test);
                disturbed.push(why);
            }
        }
    }
    panic!("every attempt was disturbed before the pressure started: {disturbed:#?}")
}

/// One run in the fresh child cgroup `child`; `Err` if something purged before the hog.
fn attempt(s: &Setup, child: ChildCgroup) -> Result<Outcome, String> {
    let cg = child.cgroup().clone();
    let procs = cg.file("cgroup.procs");
    let started = Instant::now();

    let holder_role = match s.policy {
        Policy::Hybrid => HYBRID_HOLDER,
        _ => MANAGED_HOLDER,
    };
    let mut cmd = role_command(s.test, holder_role);
    if s.reclaimer_off {
        cmd.env("VRANGE_RECLAIMER", "off");
    }
    if s.sources_off {
        for name in ["VRANGE_PSI", "VRANGE_VMPRESSURE", "VRANGE_HEADROOM"] {
            cmd.env(name, "off");
        }
    }
    join_before_exec(&mut cmd, &procs).expect("open cgroup.procs");
    let mut holder = Role::spawn("holder", cmd);
    let ready = holder.expect("READY", SYNC);
    if ready.u64("purged") != 0 {
        return Err(format!(
            "{} bytes purged before the hog started (source:events:bytes {})",
            ready.u64("purged"),
            ready.str("early")
        ));
    }
    let usage_ready = cg.usage().expect("read the cgroup's usage");
    // The reclaimer armed from its own CPU, whose batch may still hold folios (2 MiB ones
    // too) that are not lazy-free yet.
    vrange_testkit::lru::drain_batches();
    // VMA by VMA (smaps_rollup can miss a VMA when a writer of the holder's mappings waits
    // meanwhile), with the holder's larger VMAs listed for the report.
    let vmas = procfs::smaps_vmas(Some(holder.pid() as u32)).expect("the holder's smaps");
    let lazy_free_kb = vmas.iter().map(|v| v.smaps.lazy_free_kb).sum();
    let vma_list = vmas
        .iter()
        .filter(|v| v.smaps.rss_kb >= 1024)
        .map(|v| {
            format!(
                "{:x}-{:x} rss {} huge {} lazy {}",
                v.start, v.end, v.smaps.rss_kb, v.smaps.anon_huge_kb, v.smaps.lazy_free_kb
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    let oom_before = cg.oom_kills().expect("read the OOM kill count");

    // The hog's allocation: `MUST_FREE` over the limit given what is charged now.
    let hog_bytes = ((LIMIT as u64 + MUST_FREE as u64).saturating_sub(usage_ready))
        .next_multiple_of(MIB as u64);
    let mut cmd = role_command(s.test, HOG);
    cmd.env(HOG_BYTES_ENV, hog_bytes.to_string())
        .env(HOG_STEP_ENV, s.step.min(hog_bytes as usize).to_string())
        .env(HOG_PAUSE_ENV, s.pause.as_micros().to_string());
    join_before_exec(&mut cmd, &procs).expect("open cgroup.procs");
    let lazyfreed_before = vmstat("pglazyfreed");
    let hog_started = Instant::now();
    let mut hog = Role::spawn("hog", cmd);
    let hog_reply = hog.next(HOG_DEADLINE).ok();
    let hog_exit = hog.wait(HOG_DEADLINE);
    let hog_ms = hog_started.elapsed().as_millis();
    let lazyfreed = vmstat("pglazyfreed")
        .zip(lazyfreed_before)
        .map(|(after, before)| after.saturating_sub(before));
    let oom_after = cg.oom_kills().expect("read the OOM kill count");
    let peak = peak(&cg);

    // The holder unmarks and checks everything.
    let mut regions = Vec::new();
    let mut sources = Vec::new();
    let (mut stats, mut verdict) = (None, None);
    if holder.send("check") {
        while verdict.is_none() {
            let Ok(r) = holder.next(SYNC) else { break };
            match r.tag.as_str() {
                "REGION" => regions.push(r),
                "SOURCE" => sources.push(SourceLine {
                    name: r.str("name").to_string(),
                    events: r.u64("events"),
                    ranges: r.u64("ranges"),
                    bytes: r.u64("bytes"),
                    purging_events: r.u64("purging_events"),
                    last_ns: r.u64("last_ns"),
                    max_ns: r.u64("max_ns"),
                    total_ns: r.u64("total_ns"),
                }),
                "STATS" => stats = Some(r),
                "VERDICT" => verdict = Some(r),
                _ => panic!("holder: unexpected {r:?}"),
            }
        }
    }
    holder.close_stdin();
    let holder_exit = holder.wait(SYNC);
    let diagnostics = holder.diagnostics();
    let elapsed = started.elapsed();
    drop(holder);
    drop(hog);
    let dir = cg.path().to_path_buf();
    cgroup::remove(child);

    assert_eq!(
        ready.str("cgroup"),
        dir.display().to_string(),
        "the holder runs in the child cgroup"
    );
    Ok(Outcome {
        ready,
        usage_ready,
        lazyfreed,
        lazy_free_kb,
        vma_list,
        hog_bytes,
        hog: hog_exit,
        hog_reply,
        hog_ms,
        oom_before,
        oom_after,
        peak,
        holder_exit,
        regions,
        sources,
        stats,
        verdict,
        elapsed,
        diagnostics,
    })
}

/// Checks what every run with a working reclaimer must satisfy: the hog fits, nothing is
/// killed, and the holder reports exactly what it lost. Returns (pages reported purged, bytes
/// the reclaimer purged).
fn check_survived(out: &Outcome, label: &str) -> (u64, u64) {
    let report = out.report(label);
    assert!(
        out.hog == Exit::Code(0) && out.oom_after == out.oom_before,
        "the hog must fit once volatile memory is freed, but it ended with {} and the cgroup \
         counted {} OOM kills\n{report}\n{}",
        out.hog,
        out.oom_after - out.oom_before,
        out.diagnostics
    );
    assert_eq!(
        out.holder_exit,
        Exit::Code(0),
        "holder\n{report}\n{}",
        out.diagnostics
    );
    assert_eq!(
        out.ready.u64("pinned"),
        PINNED_BYTES as u64,
        "the pinned regions are pinned\n{report}"
    );
    let v = out.verdict.as_ref().expect("the holder's verdict");
    let stats = out.stats.as_ref().expect("the holder's stats");
    let page = page_size() as u64;
    let region_pages = (REGION / page_size()) as u64;
    let marked = (VOLATILE_BYTES / page_size()) as u64;
    assert_eq!(
        (v.u64("pages"), v.u64("volatile")),
        (marked, marked),
        "every page of the volatile regions was volatile\n{report}"
    );
    assert_eq!(
        (v.u64("bad_pinned"), v.u64("pinned_reported")),
        (0, 0),
        "pinned regions are intact byte for byte and report nothing\n{report}"
    );
    assert_eq!(
        v.u64("bad"),
        0,
        "every volatile page reads all zero or exactly its pattern\n{report}"
    );
    assert_eq!(
        v.u64("inexact"),
        0,
        "each region reports exactly its zero-reading pages as purged\n{report}"
    );
    assert_eq!(v.u64("purged"), v.u64("zero"), "{report}");
    assert_eq!(v.u64("purged") + v.u64("intact"), marked, "{report}");
    assert!(v.u64("purged") > 0, "the pressure purged nothing\n{report}");
    for r in &out.regions {
        assert_eq!(r.u64("pages"), region_pages, "{report}");
    }
    // Every range the reclaimer purged reports all its pages, so the pages reported lost cover
    // the reclaimer's bytes; and every purge is attributed to a source.
    let reported = v.u64("purged") * page;
    let reclaimer = stats.u64("purged_total");
    assert!(
        reported >= reclaimer,
        "the reclaimer purged {reclaimer} bytes but unmark reported only {reported}\n{report}"
    );
    let attributed: u64 = out.sources.iter().map(|s| s.bytes).sum();
    assert_eq!(
        attributed, reclaimer,
        "per-source bytes add up to the total purged\n{report}"
    );
    assert_eq!(
        stats.u64("losses"),
        out.regions.iter().filter(|r| r.u64("purged") > 0).count() as u64,
        "one loss counted per region reported purged\n{report}"
    );
    (v.u64("purged"), reclaimer)
}

/// Runs the hybrid scenario and checks it; returns the report and (pages reported purged,
/// bytes the reclaimer purged).
fn hybrid(label: &str, test: &'static str, sources_off: bool) -> Option<(String, u64, u64)> {
    let out = run(Setup {
        test,
        policy: Policy::Hybrid,
        step: usize::MAX,
        pause: Duration::ZERO,
        reclaimer_off: false,
        sources_off,
    })?;
    let report = out.report(label);
    assert_eq!(
        (out.ready.u64("armed"), out.ready.u64("reclaimer_running")),
        (VOLATILE_BYTES as u64, 1),
        "every volatile region is armed before the pressure\n{report}"
    );
    // MADV_FREE parks up to 31 small folios per CPU in a batch before they become lazy-free,
    // and passes over a folio that is off the LRU or locked at that moment (compaction or
    // reclaim has it): the kernel may leave some armed memory out of its lazy-free lists, which
    // the reclaimer still purges whole. Enough must be lazy-free for the kernel alone to free
    // what the hog needs; never more than was armed. A shortfall is printed with the VMAs.
    let cpus = std::thread::available_parallelism().map_or(64, |n| n.get()) as u64;
    let slack_kb = 31 * cpus * page_size() as u64 / 1024;
    let lazy_kb = (VOLATILE_BYTES / 1024) as u64;
    let lazy = out.lazy_free_kb;
    let vmas = format!("holder's VMAs when ready: {}\n", out.vma_list);
    assert!(
        lazy + slack_kb >= (MUST_FREE / 1024) as u64 && lazy <= lazy_kb,
        "enough of the armed memory is lazy-free in the kernel's eyes, and no more than was \
         armed\n{report}{vmas}"
    );
    let short = if lazy + slack_kb < lazy_kb {
        format!(
            "{label}: the kernel left {} kB of the {lazy_kb} kB armed out of its lazy-free \
             lists\n{vmas}",
            lazy_kb - lazy
        )
    } else {
        String::new()
    };
    let (purged_pages, reclaimer_bytes) = check_survived(&out, label);
    let reported = purged_pages * page_size() as u64;
    let fired: Vec<&str> = out
        .sources
        .iter()
        .filter(|s| s.bytes > 0)
        .map(|s| s.name.as_str())
        .collect();
    let summary = format!(
        "{report}{short}{label}: unmark reported {} lost ({} pages): {} in ranges the reclaimer purged \
         whole (MADV_DONTNEED), {} dropped page by page by the kernel's direct reclaim in the \
         others; sources that purged: {}\n",
        mib(Some(reported)),
        purged_pages,
        mib(Some(reclaimer_bytes)),
        mib(Some(reported - reclaimer_bytes)),
        if fired.is_empty() {
            "none".to_string()
        } else {
            fired.join(", ")
        }
    );
    Some((summary, purged_pages, reclaimer_bytes))
}

/// 24 hybrid regions of 4 MiB, 16 volatile and armed (handed to the kernel after 200 ms), 8
/// pinned, in a 160 MiB cgroup; a hog touches enough memory at once that at least 32 MiB of
/// volatile memory must go. The hog must exit normally with no OOM kill, and every volatile
/// region must report exactly its zero-reading pages as purged, every other page holding its
/// pattern; pinned regions intact byte for byte. Prints which sources fired and how the purged
/// memory splits between the reclaimer (whole ranges) and the kernel (lazy-free pages dropped
/// by direct reclaim, in ranges the reclaimer did not purge afterwards).
#[test]
fn hybrid_under_fast_pressure_hog_survives_and_reports_exactly() {
    if let Some(role) = role() {
        return play(&role);
    }
    let _serial = serial();
    if let Some((summary, _, _)) = hybrid("hybrid", HYBRID_TEST, false) {
        print!("{summary}");
    }
}

/// The same with every pressure source of the holder off, so that its reclaimer only arms:
/// the kernel alone must discard at least 32 MiB of armed pages, page by page (a THP whole),
/// and unmark must report exactly the pages it discarded. With the sources on, the reclaimer
/// usually reacts first (vmpressure) and purges whole ranges, which hides this path.
#[test]
fn hybrid_under_fast_pressure_kernel_alone_reports_exactly() {
    if let Some(role) = role() {
        return play(&role);
    }
    let _serial = serial();
    let Some((summary, purged, reclaimer)) = hybrid("kernel alone", KERNEL_TEST, true) else {
        return;
    };
    print!("{summary}");
    assert_eq!(
        reclaimer, 0,
        "no pressure source, no purge by the reclaimer\n{summary}"
    );
    assert!(
        purged * page_size() as u64 >= MUST_FREE as u64,
        "the kernel discarded at least what the hog needed\n{summary}"
    );
}

/// 24 managed regions of 4 MiB, 16 volatile (64 MiB), 8 pinned (32 MiB), VRANGE_POLL_MS=20,
/// in a 160 MiB cgroup; a hog grows 1 MiB every 15 ms to 32 MiB over what fits. The kernel
/// cannot take managed memory (resident anonymous, no swap), so only the reclaimer can make
/// room: the hog must exit normally with no OOM kill, purged regions must read zero (whole),
/// the others and the pinned ones their pattern, and headroom, vmpressure or PSI must have
/// purged. The control run, same scenario with VRANGE_RECLAIMER=off in the holder, must end
/// in an OOM kill: the scenario does fail without the reclaimer.
#[test]
fn managed_under_slow_pressure_reclaimer_alone_prevents_oom() {
    if let Some(role) = role() {
        return play(&role);
    }
    let _serial = serial();
    let setup = Setup {
        test: MANAGED_TEST,
        policy: Policy::Managed,
        step: SLOW_STEP,
        pause: SLOW_PAUSE,
        reclaimer_off: false,
        sources_off: false,
    };
    let Some(out) = run(setup) else {
        return;
    };
    let report = out.report("managed");
    assert_eq!(
        (out.ready.u64("volatile"), out.ready.u64("armed")),
        (VOLATILE_BYTES as u64, 0),
        "managed ranges are volatile and never armed\n{report}"
    );
    assert!(
        out.lazy_free_kb < 1024,
        "nothing of a managed region is lazy-free\n{report}"
    );
    let (purged_pages, reclaimer_bytes) = check_survived(&out, "managed");
    let region_pages = (REGION / page_size()) as u64;
    for r in &out.regions {
        let p = r.u64("purged");
        assert!(
            p == 0 || p == region_pages,
            "a managed range is purged whole: region {} reports {p} pages\n{report}",
            r.str("i")
        );
    }
    assert_eq!(
        purged_pages * page_size() as u64,
        reclaimer_bytes,
        "only the reclaimer purges managed ranges: unmark reports exactly its bytes\n{report}"
    );
    let pressure = out.source_bytes(&[
        "headroom",
        "vmpressure-medium",
        "vmpressure-critical",
        "psi",
        "psi-cgroup",
    ]);
    assert!(
        pressure > 0,
        "a pressure source (headroom, vmpressure, PSI) purged\n{report}"
    );
    print!("{report}");

    // Control: the same without the reclaimer must be OOM-killed.
    let control = run(Setup {
        reclaimer_off: true,
        ..setup
    })
    .expect("the cgroup could be created a moment ago");
    let creport = control.report("control (VRANGE_RECLAIMER=off)");
    print!("{creport}");
    assert_eq!(
        (
            control.ready.u64("reclaimer_running"),
            control.ready.str("sources")
        ),
        (0, "none"),
        "VRANGE_RECLAIMER=off: no reclaimer thread\n{creport}"
    );
    assert!(
        control.oom_after > control.oom_before || control.hog == Exit::Signal(libc::SIGKILL),
        "without the reclaimer the hog cannot fit: an OOM kill was expected, but the hog ended \
         with {} and the cgroup counted {} OOM kills\n{creport}\n{}",
        control.hog,
        control.oom_after - control.oom_before,
        control.diagnostics
    );
    // The holder survived (the hog is the OOM killer's first choice) and lost nothing: nothing
    // purged its managed ranges.
    assert_eq!(
        control.holder_exit,
        Exit::Code(0),
        "{creport}\n{}",
        control.diagnostics
    );
    let v = control.verdict.as_ref().expect("the holder's verdict");
    let marked = (VOLATILE_BYTES / page_size()) as u64;
    assert_eq!(
        (
            v.u64("purged"),
            v.u64("intact"),
            v.u64("bad"),
            v.u64("bad_pinned")
        ),
        (0, marked, 0, 0),
        "without the reclaimer nothing is purged\n{creport}"
    );
    assert_eq!(
        control.stats.as_ref().map(|s| s.u64("purged_total")),
        Some(0),
        "{creport}"
    );
}
