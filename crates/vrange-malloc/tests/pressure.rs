//! A process's freed memory under pressure in a child memory cgroup, vrange-malloc against
//! glibc: memory a process has freed must not keep the next process out.
//!
//! # Scenario
//! A child memory cgroup (v1 or v2) with a hard limit of `LIMIT_MIB` and no swap. Two processes of
//! `peak_and_next.c` (compiled at test time; the workload of vrange-bench's `pressure` suite,
//! kept in `crates/vrange-bench/c/`) run in it, both under the shim or both without it:
//!
//! 1. the *peak* process allocates `PEAK_MIB` in blocks of `PEAK_BLOCK_KIB` (below glibc's
//!    128 KiB mmap threshold, so glibc serves them from its heap), each followed by a small
//!    block that stays live (so glibc cannot trim its heap top), writes every page, frees every
//!    large block and says DONE; then it stays alive, idle;
//! 2. the *next* process then allocates and writes `NEXT_MIB` and exits. It makes itself the
//!    OOM killer's first choice, so an OOM kill shows as the next process killed by SIGKILL.
//!
//! Both together need more than the limit, so the next process fits only if at least
//! `PEAK_MIB + NEXT_MIB - LIMIT_MIB` of the peak process's freed memory leaves it. glibc keeps
//! it (freed heap chunks stay resident), so the next process must be OOM-killed: that is the
//! control, asserted, which shows the scenario can fail. vrange-malloc's free memory is
//! volatile: the next process must fit with no OOM kill, and the peak process's resident size
//! must have dropped by at least that much. At the end the peak process callocs its blocks
//! again: memory given back must be reusable and read as zero.
//!
//! `idle_peak_makes_room_for_the_next_process_with_vrange_malloc_not_glibc` runs the shim with
//! its defaults: the peak process idles until its reclaimer has armed its free chunks (handed
//! them to the kernel's lazy-free path, `LazyFree` in smaps, after the 1 s arm delay), then the
//! next process allocates as fast as it can; the kernel discards the armed pages as the next
//! process's charges need them, and the reclaimer purges on the cgroup's pressure events
//! (vmpressure on v1, PSI in `memory.pressure` on v2).
//! glibc's peak process idles `GLIBC_IDLE` (idling changes nothing for glibc).
//! `headroom_alone_makes_room_for_a_paced_next_process` pushes arming past the test
//! (`VRANGE_MALLOC_ARM_DELAY_MS=60000`) and turns vmpressure and PSI off, so only the
//! reclaimer's headroom poll (every 100 ms) can free anything; the next process allocates at
//! about 200 MiB/s (`PACED_PAUSE_US` per MiB), a rate that poll can follow, and the peak
//! process's exit summary must show the reclaimer purging at least what was needed.
//!
//! Without arming, a next process that allocates at full speed races the reclaimer's reaction
//! to vmpressure against the memory cgroup's OOM killer (which acts after a few failed reclaim
//! passes), and sometimes loses: that case is not a test.
//!
//! Needs root and a memory cgroup it may make children in; elsewhere the tests print "skipped: ..." and
//! pass, unless `CI` is set.

mod common;
use common::*;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};
use vrange_sys::cgroup::{join_before_exec, MemCgroup};
use vrange_testkit::build::{bench_workload, shim};
use vrange_testkit::proc::{Exit, Proc};
use vrange_testkit::procfs::{peak_rss_kb, rss_lazy_kb, vmstat};
use vrange_testkit::scratch::Scratch;
use vrange_testkit::{cgroup, is_root, missing, serial, skip};

const MIB: u64 = 1 << 20;
/// The child cgroup's hard limit.
const LIMIT_MIB: u64 = 384;
/// The peak process's working set and block size (a `malloc` below glibc's mmap threshold and
/// at or above the shim's `VRANGE_MALLOC_THRESHOLD`).
const PEAK_MIB: u64 = 300;
const PEAK_BLOCK_KIB: u64 = 96;
/// The next process's allocation and block size.
const NEXT_MIB: u64 = 250;
const NEXT_BLOCK_KIB: u64 = 1024;
/// The paced next process's pause after each block (about 200 MiB/s in all).
const PACED_PAUSE_US: u64 = 5000;
/// Every wait: the peak process's setup, the next process's run, the peak process's reuse.
const DEADLINE: Duration = Duration::from_secs(20);
/// How long glibc's peak process idles before the next process starts.
const GLIBC_IDLE: Duration = Duration::from_millis(1200);
/// The most vrange-malloc's peak process idles waiting for its free memory to be armed.
const ARM_WAIT: Duration = Duration::from_secs(10);
/// What must leave the peak process for the next one to fit.
const NEEDED_MIB: u64 = PEAK_MIB + NEXT_MIB - LIMIT_MIB;
/// The peak process counts as armed when no more than this much of its resident memory is not
/// lazy-free (its live small blocks, metadata, libraries and runtime).
const ARMED_SLACK_MIB: u64 = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Allocator {
    Glibc,
    VrangeMalloc,
}

/// How long the peak process idles before the next process starts.
#[derive(Debug, Clone, Copy)]
enum Idle {
    For(Duration),
    /// Until its free memory is armed: at most `ARMED_SLACK_MIB` of its resident memory is
    /// not lazy-free (some may have been purged meanwhile); at most `ARM_WAIT`.
    UntilArmed,
    /// Not at all.
    No,
}

/// How one run is set up.
struct Setup {
    label: &'static str,
    allocator: Allocator,
    idle: Idle,
    /// The next process's pause after each block.
    pause_us: u64,
    /// vrange settings for the peak process.
    peak_env: &'static [(&'static str, &'static str)],
}

/// What one run found.
struct Outcome {
    label: &'static str,
    allocator: Allocator,
    /// The cgroup's usage once the peak process had freed its blocks.
    usage_after_free: u64,
    idle_ms: u128,
    /// The peak process's resident KiB after its free, its resident and lazy-free KiB when the
    /// next process started, and its resident KiB when the next process had ended.
    rss_done_kb: u64,
    /// The peak process's peak resident size (VmHWM) when it said DONE.
    hwm_kb: u64,
    rss_start_kb: u64,
    lazy_free_kb: u64,
    rss_end_kb: u64,
    /// Lazy-free pages the kernel discarded while the next process ran (system-wide
    /// /proc/vmstat pglazyfreed, so other processes' count too).
    kernel_discarded_kb: Option<u64>,
    next: Exit,
    next_said: Option<String>,
    next_ms: u128,
    oom_kills: u64,
    failcnt: u64,
    max_usage: u64,
    peak: Exit,
    peak_reused: Option<String>,
    /// MiB the peak process's reclaimer purged (its exit summary); vrange-malloc only.
    purged_mib: Option<f64>,
    peak_stderr: String,
}

impl Outcome {
    fn row(&self) -> String {
        let mib = |b: u64| format!("{:.0}", b as f64 / MIB as f64);
        let kib = |k: u64| mib(k * 1024);
        format!(
            "{:<36} {:>7} {:>7} {:>7} {:>8} {:>9} {:<8} {:>7} {:>4} {:>7} {:>7} {:>7} {:>7} \
             {:>7} {:>7} {:>5}",
            self.label,
            mib(self.usage_after_free),
            kib(self.rss_done_kb),
            self.idle_ms,
            kib(self.rss_start_kb),
            kib(self.lazy_free_kb),
            self.next.to_string(),
            self.next_ms,
            self.oom_kills,
            self.failcnt,
            mib(self.max_usage),
            kib(self.rss_end_kb),
            self.purged_mib
                .map_or("-".to_string(), |m| format!("{m:.0}")),
            self.kernel_discarded_kb.map_or("?".to_string(), kib),
            self.peak.to_string(),
            self.peak_reused
                .as_deref()
                .and_then(|l| l.split_once("nonzero="))
                .map_or("-", |(_, z)| z),
        )
    }

    fn details(&self) -> String {
        format!(
            "{}: next process said {:?}; peak process said {:?}; peak stderr:\n{}",
            self.label, self.next_said, self.peak_reused, self.peak_stderr
        )
    }
}

fn table(rows: &[&Outcome]) -> String {
    let mut out = format!(
        "pressure: cgroup limit {LIMIT_MIB} MiB, no swap; the peak process frees {PEAK_MIB} MiB \
         of {PEAK_BLOCK_KIB} KiB blocks and idles; the next process needs {NEXT_MIB} MiB, so \
         {NEEDED_MIB} MiB must leave the peak process. MiB unless said: cg_used, rss = the cgroup's \
         usage and the peak process's Rss after its free; rss@next, lazy@next = its Rss and \
         LazyFree when the next process starts; oom = OOM kills; peak_cg = the cgroup's max \
         usage; rss_end = the peak process's Rss after the next one; purged = by its reclaimer \
         (whole run); kernel = lazy-free pages the kernel discarded meanwhile (system-wide); \
         zero! = nonzero words calloc returned on reuse\n\
         {:<36} {:>7} {:>7} {:>7} {:>8} {:>9} {:<8} {:>7} {:>4} {:>7} {:>7} {:>7} {:>7} \
         {:>7} {:>7} {:>5}\n",
        "run",
        "cg_used",
        "rss",
        "idle_ms",
        "rss@next",
        "lazy@next",
        "next",
        "next_ms",
        "oom",
        "failcnt",
        "peak_cg",
        "rss_end",
        "purged",
        "kernel",
        "peak",
        "zero!"
    );
    for r in rows {
        out.push_str(&r.row());
        out.push('\n');
    }
    out
}

/// The environment the scenario needs, or why it cannot run here.
struct Env {
    parent: MemCgroup,
    exe: PathBuf,
    _dir: Scratch,
}

fn env() -> Result<Env, String> {
    if !is_root() {
        return Err("not root: creating a memory cgroup needs root".into());
    }
    let parent = cgroup::parent()?;
    if let Some(why) = missing(&["/usr/bin/gcc"]) {
        return Err(why);
    }
    let dir = Scratch::new("pressure");
    let exe = dir.join("peak_and_next");
    compile(bench_workload("peak_and_next.c"), &exe, &[]);
    if let Err(e) = std::fs::metadata(shim()) {
        return Err(format!("no shim: {e}"));
    }
    Ok(Env {
        parent,
        exe,
        _dir: dir,
    })
}

/// A command for one of the processes, under the allocator of the run.
fn command(env: &Env, allocator: Allocator, args: &[String]) -> Command {
    let mut cmd = Command::new(&env.exe);
    cmd.args(args);
    match allocator {
        Allocator::Glibc => {
            without_shim(&mut cmd);
        }
        Allocator::VrangeMalloc => {
            with_shim(&mut cmd, &[]).env("VRANGE_MALLOC_THRESHOLD", "64K");
        }
    }
    cmd
}

/// Runs the scenario once in a fresh child cgroup, removed on every path (its `Drop` moves any
/// process left to the parent first; the processes, dropped before it, are killed and reaped).
/// `None` (with a printed reason) if the cgroup cannot be created here.
fn run(env: &Env, s: &Setup) -> Option<Outcome> {
    let child = match cgroup::child_of(&env.parent, "vrange-malloc-pressure-", LIMIT_MIB * MIB) {
        Ok(child) => child,
        Err(why) => {
            skip(why);
            return None;
        }
    };
    let cg = child.cgroup().clone();
    let procs = cg.file("cgroup.procs");

    let mut cmd = command(
        env,
        s.allocator,
        &[
            "peak".into(),
            PEAK_MIB.to_string(),
            PEAK_BLOCK_KIB.to_string(),
        ],
    );
    for (k, v) in s.peak_env {
        cmd.env(k, v);
    }
    join_before_exec(&mut cmd, &procs).expect("open cgroup.procs");
    let mut peak = Proc::spawn(cmd);
    let pid = peak.pid();
    if peak.line("DONE", Instant::now() + DEADLINE).is_none() {
        let exit = peak.wait(Duration::from_secs(1));
        panic!(
            "{}: the peak process did not finish its peak ({exit})\n{}",
            s.label,
            peak.stderr()
        );
    }
    let usage_after_free = cg.usage().expect("the cgroup's usage");
    let (rss_done_kb, _) = rss_lazy_kb(pid);
    let hwm_kb = peak_rss_kb(pid);
    let idle_started = Instant::now();
    match s.idle {
        Idle::For(d) => std::thread::sleep(d),
        Idle::UntilArmed => loop {
            let (rss, lazy) = rss_lazy_kb(pid);
            if rss <= lazy + (ARMED_SLACK_MIB << 10) || idle_started.elapsed() >= ARM_WAIT {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        },
        Idle::No => {}
    }
    let idle_ms = idle_started.elapsed().as_millis();
    let (rss_start_kb, lazy_free_kb) = rss_lazy_kb(pid);

    let mut cmd = command(
        env,
        s.allocator,
        &[
            "next".into(),
            NEXT_MIB.to_string(),
            NEXT_BLOCK_KIB.to_string(),
            s.pause_us.to_string(),
        ],
    );
    join_before_exec(&mut cmd, &procs).expect("open cgroup.procs");
    let lazyfreed_before = vmstat("pglazyfreed");
    let started = Instant::now();
    let mut next = Proc::spawn(cmd);
    let next_exit = next.wait(DEADLINE);
    let next_ms = started.elapsed().as_millis();
    let kernel_discarded_kb = vmstat("pglazyfreed")
        .zip(lazyfreed_before)
        .map(|(after, before)| after.saturating_sub(before) * vrange::page_size() as u64 / 1024);
    let next_said = next.line("NEXT", Instant::now() + Duration::from_millis(100));
    let oom_kills = cg.oom_kills().expect("the cgroup's OOM kill count");
    let failcnt = cgroup::limit_hits(&cg).expect("the cgroup's count of limit hits");
    let max_usage = cgroup::peak(&cg).expect("the cgroup's peak usage");
    let (rss_end_kb, _) = rss_lazy_kb(pid);

    // End of input: the peak process reuses its memory and exits.
    peak.close_stdin();
    let peak_reused = peak.line("REUSED", Instant::now() + DEADLINE);
    let peak_exit = peak.wait(DEADLINE);
    let peak_stderr = peak.stderr();
    let purged_mib = summaries(&peak_stderr).last().map(|s| s.purged_mib);

    drop((next, peak));
    cgroup::remove(child);
    Some(Outcome {
        label: s.label,
        allocator: s.allocator,
        usage_after_free,
        idle_ms,
        rss_done_kb,
        hwm_kb,
        rss_start_kb,
        lazy_free_kb,
        rss_end_kb,
        kernel_discarded_kb,
        next: next_exit,
        next_said,
        next_ms,
        oom_kills,
        failcnt,
        max_usage,
        peak: peak_exit,
        peak_reused,
        purged_mib,
        peak_stderr,
    })
}

/// What every vrange-malloc run must show: the next process fitted, nobody was OOM-killed, at
/// least `NEEDED_MIB` left the peak process, and the peak process reused the memory it gave
/// back, reading zeroes from calloc.
fn check_vrange_malloc(o: &Outcome, report: &str) {
    assert_eq!(o.allocator, Allocator::VrangeMalloc);
    assert!(
        o.next == Exit::Code(0)
            && o.next_said
                .as_deref()
                .is_some_and(|l| l.starts_with("NEXT ok")),
        "{}: the next process must fit once the peak process's free memory is given back, but \
         it ended with {}\n{report}{}",
        o.label,
        o.next,
        o.details()
    );
    assert_eq!(
        o.oom_kills,
        0,
        "{}: no OOM kill\n{report}{}",
        o.label,
        o.details()
    );
    // Measured from the peak process's peak (VmHWM): its reclaimer may already have given part
    // back before the first reading after the free (headroom, pressure events). Before Linux 6.2
    // a thread's RSS changes reach the process's count only every 64 page faults or so
    // (SPLIT_RSS_COUNTING), so any one reading can lag behind: the largest is taken.
    let rss_before_kb = o.hwm_kb.max(o.rss_done_kb).max(o.rss_start_kb);
    assert!(
        o.rss_end_kb + (NEEDED_MIB << 10) <= rss_before_kb,
        "{}: at least {NEEDED_MIB} MiB must have left the peak process, but its Rss went from \
         {} (its peak) to {} KiB\n{report}{}",
        o.label,
        rss_before_kb,
        o.rss_end_kb,
        o.details()
    );
    assert!(
        o.peak == Exit::Code(0)
            && o.peak_reused
                .as_deref()
                .is_some_and(|l| l.ends_with(" nonzero=0")),
        "{}: the peak process must survive and calloc zeroed blocks from the memory it gave \
         back; it ended with {}\n{report}{}",
        o.label,
        o.peak,
        o.details()
    );
}

/// The peak process frees 300 MiB and idles; the next process needs 250 MiB in a 384 MiB
/// cgroup, as fast as it can. With glibc it must be OOM-killed (the control); with
/// vrange-malloc's defaults, once the idle peak process's free memory is armed, it must fit
/// with no OOM kill. Prints both runs side by side.
#[test]
fn idle_peak_makes_room_for_the_next_process_with_vrange_malloc_not_glibc() {
    let _serial = serial();
    let env = match env() {
        Ok(env) => env,
        Err(why) => return skip(why),
    };
    let started = Instant::now();
    // vrange-malloc first: the stalls of the control's OOM often fire the system-wide PSI
    // trigger of a peak process started right after it, which then purges a quarter of its
    // free memory before the next process starts (harmless, but noise in the numbers).
    let Some(vm) = run(
        &env,
        &Setup {
            label: "vrange-malloc (defaults)",
            allocator: Allocator::VrangeMalloc,
            idle: Idle::UntilArmed,
            pause_us: 0,
            peak_env: &[],
        },
    ) else {
        return;
    };
    let Some(glibc) = run(
        &env,
        &Setup {
            label: "glibc",
            allocator: Allocator::Glibc,
            idle: Idle::For(GLIBC_IDLE),
            pause_us: 0,
            peak_env: &[],
        },
    ) else {
        return;
    };
    let report = table(&[&glibc, &vm]);
    print!("{report}");
    println!(
        "pressure: both runs in {} ms",
        started.elapsed().as_millis()
    );

    assert!(
        vm.rss_start_kb <= vm.lazy_free_kb + (ARMED_SLACK_MIB << 10),
        "vrange-malloc: the idle peak process's free memory must be armed (lazy-free) within \
         {ARM_WAIT:?}, but only {} KiB of its {} KiB resident was\n{report}{}",
        vm.lazy_free_kb,
        vm.rss_start_kb,
        vm.details()
    );
    check_vrange_malloc(&vm, &report);
    // The control: glibc keeps freed heap chunks resident, so the two cannot fit.
    assert!(
        glibc.oom_kills > 0 || glibc.next == Exit::Signal(libc::SIGKILL),
        "glibc: an OOM kill was expected (the peak process keeps {PEAK_MIB} MiB resident), but \
         the next process ended with {} and the cgroup counted {} OOM kills\n{report}{}",
        glibc.next,
        glibc.oom_kills,
        glibc.details()
    );
}

/// The peak process with arming pushed past the test and its vmpressure and PSI sources off:
/// only its reclaimer's headroom poll can give memory back, every 100 ms, so the next process
/// allocates at about 200 MiB/s, right after the peak process's free. It must fit with no OOM
/// kill, and the reclaimer must have purged at least what was needed.
#[test]
fn headroom_alone_makes_room_for_a_paced_next_process() {
    let _serial = serial();
    let env = match env() {
        Ok(env) => env,
        Err(why) => return skip(why),
    };
    let Some(o) = run(
        &env,
        &Setup {
            label: "vrange-malloc (headroom only, paced)",
            allocator: Allocator::VrangeMalloc,
            idle: Idle::No,
            pause_us: PACED_PAUSE_US,
            peak_env: &[
                ("VRANGE_MALLOC_ARM_DELAY_MS", "60000"),
                ("VRANGE_VMPRESSURE", "off"),
                ("VRANGE_PSI", "off"),
            ],
        },
    ) else {
        return;
    };
    let report = table(&[&o]);
    print!("{report}");
    check_vrange_malloc(&o, &report);
    assert!(
        o.purged_mib.is_some_and(|m| m >= NEEDED_MIB as f64),
        "the peak process's reclaimer purged {:?} MiB, less than the {NEEDED_MIB} MiB the next \
         process needed (arming is off, so only the reclaimer can have freed it)\n{report}{}",
        o.purged_mib,
        o.details()
    );
}
