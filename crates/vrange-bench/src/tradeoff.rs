//! tradeoff: each allocator and configuration on two axes from one run. Throughput: the
//! operations per second of a steady churn of large blocks. Memory: how much of a freed peak
//! the process gives back within 1 s when a neighbour in its memory cgroup needs it, and
//! whether the neighbour gets it or is OOM-killed. An allocator that keeps its free memory is
//! fast and gives nothing back; one that gives it back at every free is slow. vrange-malloc's
//! aim is the top-right corner: the throughput of the best peer as shipped, and the memory of
//! the eager ones.
//!
//! The workload is `c/tradeoff.c` (built with vrange-bench, written into the output
//! directory). Each run has a fresh child memory cgroup (no swap) of the peak + 192 MiB (room for
//! the allocators' overheads at the peak):
//!
//! 1. The churner (the allocator under test, preloaded) runs T threads over a working set of
//!    64 MiB: each iteration frees a random block and mallocs one of a random size,
//!    log-uniform in [64 KiB, 2 MiB), writing one byte per 4 KiB page. After a warm-up, the
//!    iterations of 2 s (0.3 s with `--quick`) give the throughput, each thread's over its
//!    own window of at least 16 iterations (a loaded machine can stretch one iteration past
//!    the quick window).
//! 2. It grows the working set to the peak (512 MiB; 256 MiB with `--quick`), each block
//!    followed by a small block that stays live so that no allocator can give memory back by
//!    trimming a heap top; we read its RSS; it frees back to the steady working set and goes
//!    on churning.
//! 3. Right after the frees a neighbour (plain `mmap`, the same for every configuration, the
//!    OOM killer's first choice by `oom_score_adj` 1000) writes the limit − 128 MiB as fast
//!    as it can: that fits only if the churner comes down to its 64 MiB working set and at
//!    most 64 MiB more, i.e. gives back nearly all it freed. The churner's RSS is sampled
//!    every 10 ms.
//!
//! "Returned within 1 s" is the peak RSS minus the RSS 1 s after the neighbour started: an
//! eager allocator counts as returning everything at once (its RSS right after the frees is
//! in the table too), one that waits for pressure is credited with what it gave back in that
//! second. OOM kills are the cgroup's counter (v1 `memory.oom_control`, v2 `memory.events`).
//!
//! Configurations are every allocator of the other suites, the peers' own huge-page settings
//! (glibc `glibc.malloc.hugetlb=1`, jemalloc `thp:always`, mimalloc large OS pages, so huge
//! pages are compared with huge pages), and vrange-malloc with huge pages on its chunks too
//! (`VRANGE_MALLOC_THP=always`; its default keeps chunks on small pages), and
//! vrange-malloc handing free chunks to the kernel at the reclaimer's next tick
//! (`VRANGE_MALLOC_ARM_DELAY_MS=0`; by default it waits 1 s, during which only its reclaimer's
//! reaction to the cgroup's pressure can free them). Before the
//! runs the suite asks each peer whether it read its huge-page setting (glibc: `ld.so
//! --list-tunables`; jemalloc: `stats_print`; mimalloc: `MIMALLOC_VERBOSE=1`; an allocator
//! that does not report it fails its row), and the table shows the churner's AnonHugePages at
//! the peak. glibc advises only heap growth of at least a huge page, which blocks of at most
//! 2 MiB seldom need, so its setting changes little here.
//!
//! Threads 1 and 2 (`--quick`: 1); a cell is the median of five runs (one with `--quick`),
//! taken in turn over the configurations so that a disturbance of the shared machine does not
//! fall on one configuration alone. No published numbers exist for this scenario.
//!
//! Needs root and a memory cgroup; skipped otherwise.

use super::alloc::{self, Config, Kind};
use super::plot::{self, Axis, Labelled, Target, Unit};
use super::report::{self, progress, Csv, Table};
use super::Ctx;
use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};
use vrange_testkit::cgroup;
use vrange_testkit::proc::{clean_command, Exit, Proc};
use vrange_testkit::role::field;

const STEADY_MIB: u64 = 64;
/// Room for the allocators' own overheads at the peak (page rounding, huge pages: mimalloc's
/// large OS pages peak at 638 MiB for 512 MiB of blocks here).
const HEADROOM_MIB: u64 = 192;
/// What the churner may keep beyond its live working set and the neighbour still fit.
const KEEP_MIB: u64 = 64;
/// The window of the memory axis.
const WINDOW: Duration = Duration::from_secs(1);
/// The plot's caption of the corner vrange-malloc aims for (lines fit the legend's width).
const TARGET: &str = "target: ops/s of the best\nas-shipped peer, memory\n\
                      returned like the eager\npeers (the least of them)";
/// How long the neighbour may take to get its memory or be killed.
const NEIGHBOUR_DEADLINE: Duration = Duration::from_secs(10);

pub(super) struct Sizes {
    pub(super) peak_mib: u64,
    pub(super) limit_mib: u64,
    neighbour_mib: u64,
}

impl Sizes {
    pub(super) fn new(peak_mib: u64) -> Sizes {
        let limit_mib = peak_mib + HEADROOM_MIB;
        Sizes {
            peak_mib,
            limit_mib,
            neighbour_mib: limit_mib - STEADY_MIB - KEEP_MIB,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Debug)]
pub(super) enum Neighbour {
    Got {
        ms: f64,
    },
    /// Got its memory, then was OOM-killed while holding it (the churner grew again).
    GotThenKilled {
        ms: f64,
    },
    OomKilled,
    Ended(Exit),
    /// Neither got its memory nor ended within [`NEIGHBOUR_DEADLINE`].
    Waiting,
}

impl Neighbour {
    pub(super) fn kind(self) -> &'static str {
        match self {
            Neighbour::Got { .. } => "got it",
            Neighbour::GotThenKilled { .. } => "got it, then OOM-killed",
            Neighbour::OomKilled => "OOM-killed",
            Neighbour::Ended(_) => "ended",
            Neighbour::Waiting => "still waiting",
        }
    }
}

/// One run; sizes in KiB.
pub(super) struct Run {
    ops_per_s: f64,
    peak_kb: u64,
    peak_huge_kb: u64,
    freed_kb: u64,
    window_kb: u64,
    pub(super) neighbour: Neighbour,
    pub(super) oom_kills: u64,
    /// The churner's iterations per second from its frees to its end (the neighbour running).
    after_ops_per_s: Option<f64>,
    /// (ms since the neighbour started, churner RSS in KiB).
    trace: Vec<(f64, u64)>,
}

impl Run {
    fn returned_kb(&self) -> f64 {
        self.peak_kb as f64 - self.window_kb as f64
    }
}

fn rss(pid: i32) -> (u64, u64) {
    vrange_sys::procfs::smaps_rollup(Some(pid as u32))
        .map_or((0, 0), |s| (s.rss_kb, s.anon_huge_kb))
}

/// "1.26×", and the eager peers' small ratios with the digits that tell them apart ("0.004×").
fn ratio(x: Option<f64>) -> String {
    match x {
        Some(x) if x < 0.1 => format!("{x:.3}×"),
        x => report::times(x),
    }
}

fn last_line(text: &str) -> String {
    text.lines().last().unwrap_or("").trim().to_string()
}

pub(super) fn run_once(
    exe: &Path,
    c: &Config,
    threads: usize,
    seconds: f64,
    s: &Sizes,
) -> Result<Run, String> {
    let cg = cgroup::try_child("vrange-bench-tradeoff", s.limit_mib << 20)?;
    let kills = || cg.cgroup().oom_kills().unwrap_or(0);
    let mut cmd = clean_command(exe);
    cmd.args([
        "churn",
        "-t",
        &threads.to_string(),
        "-S",
        &seconds.to_string(),
    ])
    .args(["-w", &STEADY_MIB.to_string(), "-p", &s.peak_mib.to_string()])
    .env("VRANGE_STATS_DIR", "off");
    c.apply(&mut cmd)?;
    cgroup::join(&mut cmd, cg.cgroup())?;
    let mut churner = Proc::try_spawn(cmd)?;
    let pid = churner.pid();
    let Some(peak) = churner.line(
        "PEAK",
        Instant::now() + Duration::from_secs_f64(seconds + 60.0),
    ) else {
        let exit = churner.wait(Duration::from_secs(1));
        return Err(format!(
            "churner {exit} before its peak (OOM kills {}): {}",
            kills(),
            last_line(&churner.stderr())
        ));
    };
    let ops_per_s: f64 =
        field(&peak, "ops_per_s").ok_or("no ops_per_s= in the churner's output")?;
    let (peak_kb, peak_huge_kb) = rss(pid);
    if !churner.send("") {
        return Err("cannot write to the churner".into());
    }
    if churner
        .line("FREED", Instant::now() + Duration::from_secs(60))
        .is_none()
    {
        let exit = churner.wait(Duration::from_secs(1));
        return Err(format!(
            "churner {exit} in its frees: {}",
            last_line(&churner.stderr())
        ));
    }
    let (freed_kb, _) = rss(pid);

    let mut cmd = clean_command(exe);
    cmd.args(["neighbour", &s.neighbour_mib.to_string()]);
    cgroup::join(&mut cmd, cg.cgroup())?;
    let started = Instant::now();
    let mut neighbour = Proc::try_spawn(cmd)?;
    let mut trace = Vec::new();
    let mut window_kb = None;
    let mut got = None;
    let outcome = loop {
        let t = started.elapsed();
        let (kb, _) = rss(pid);
        trace.push((t.as_secs_f64() * 1e3, kb));
        if window_kb.is_none() && t >= WINDOW {
            window_kb = Some(kb);
        }
        if let Some(exit) = churner.ended() {
            return Err(format!(
                "churner {exit} while the neighbour ran (OOM kills {}): {}",
                kills(),
                last_line(&churner.stderr())
            ));
        }
        if got.is_none() {
            got = neighbour
                .line("GOT", Instant::now())
                .and_then(|l| field::<f64>(&l, "ms"));
        }
        let ended = neighbour.ended();
        if window_kb.is_some() {
            match (got, ended) {
                (Some(ms), _) => break Neighbour::Got { ms },
                (None, Some(Exit::Signal(libc::SIGKILL))) if kills() > 0 => {
                    break Neighbour::OomKilled
                }
                (None, Some(e)) => break Neighbour::Ended(e),
                (None, None) if t >= NEIGHBOUR_DEADLINE => break Neighbour::Waiting,
                (None, None) => {}
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let outcome = match (outcome, neighbour.ended()) {
        (Neighbour::Got { ms }, Some(Exit::Signal(libc::SIGKILL))) if kills() > 0 => {
            Neighbour::GotThenKilled { ms }
        }
        (o, _) => o,
    };
    let oom_kills = kills();
    neighbour.close_stdin();
    neighbour.wait(Duration::from_secs(5));
    churner.close_stdin();
    let end = churner.line("END", Instant::now() + Duration::from_secs(30));
    let exit = churner.wait(Duration::from_secs(10));
    if exit != Exit::Code(0) {
        return Err(format!(
            "churner {exit} at its end: {}",
            last_line(&churner.stderr())
        ));
    }
    let after_ops_per_s = end.and_then(|l| {
        let ops: f64 = field(&l, "ops")?;
        let secs: f64 = field(&l, "seconds")?;
        Some(ops / secs.max(1e-9))
    });
    drop((neighbour, churner));
    drop(cg);
    Ok(Run {
        ops_per_s,
        peak_kb,
        peak_huge_kb,
        freed_kb,
        window_kb: window_kb.unwrap_or(0),
        neighbour: outcome,
        oom_kills,
        after_ops_per_s,
        trace,
    })
}

/// The runs of one configuration at one thread count.
type Cell = report::Cell<Run>;

impl Cell {
    fn rate(&self) -> Option<f64> {
        self.median(|r| r.ops_per_s)
    }

    fn returned_mib(&self) -> Option<f64> {
        self.median(|r| r.returned_kb() / 1024.0)
    }

    /// "got it in 180 ms", "OOM-killed", or the count of each outcome when runs differ.
    fn neighbour(&self) -> String {
        let n = self.runs.len();
        let mut kinds: Vec<&str> = self.runs.iter().map(|r| r.neighbour.kind()).collect();
        kinds.dedup();
        if kinds.len() == 1 {
            return match self.runs[0].neighbour {
                Neighbour::Got { .. } | Neighbour::GotThenKilled { .. } => {
                    let ms = self.median(|r| match r.neighbour {
                        Neighbour::Got { ms } | Neighbour::GotThenKilled { ms } => ms,
                        _ => f64::NAN,
                    });
                    let then = match self.runs[0].neighbour {
                        Neighbour::GotThenKilled { .. } => ", then OOM-killed",
                        _ => "",
                    };
                    format!("got it in {:.0} ms{then}", ms.unwrap_or(f64::NAN))
                }
                Neighbour::Ended(e) if n == 1 => format!("ended: {e}"),
                Neighbour::Waiting => {
                    format!("still waiting at {} s", NEIGHBOUR_DEADLINE.as_secs())
                }
                o => o.kind().to_string(),
            };
        }
        let mut counts: Vec<(&str, usize)> = Vec::new();
        for r in &self.runs {
            let k = r.neighbour.kind();
            match counts.iter_mut().find(|(name, _)| *name == k) {
                Some((_, c)) => *c += 1,
                None => counts.push((k, 1)),
            }
        }
        counts
            .iter()
            .map(|(k, c)| format!("{k} {c}/{n}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

pub fn run(ctx: &Ctx) -> Result<(), String> {
    if !ctx.memory_cgroups("tradeoff") {
        return Ok(());
    }
    let quick = ctx.quick();
    let reps = ctx.args.reps.unwrap_or(if quick { 1 } else { 5 }).max(1);
    let seconds = ctx.args.seconds.unwrap_or(if quick { 0.3 } else { 2.0 });
    let threads = ctx
        .args
        .threads
        .clone()
        .unwrap_or_else(|| if quick { vec![1] } else { vec![1, 2] });
    let s = Sizes::new(if quick { 256 } else { 512 });
    let exe = super::workload::TRADEOFF.install(&ctx.out)?;
    let mut versions = Vec::new();
    let configs = alloc::with_huge_pages(alloc::configs(ctx.lib(), &mut versions));
    // Whether each huge-page setting was read: a setting the allocator ignored would make a
    // second copy of its default, so that configuration fails instead.
    let mut verified = Vec::new();
    let mut unread: HashMap<usize, String> = HashMap::new();
    for (i, c) in configs.iter().enumerate() {
        if c.kind == Kind::Huge && c.preload.is_ok() {
            match alloc::huge_setting_read(c) {
                Ok(evidence) => verified.push(format!("{} ({evidence})", c.allocator)),
                Err(e) => {
                    unread.insert(i, format!("{} not read: {e}", c.label));
                }
            }
        }
    }
    ctx.say(format!(
        "tradeoff: per configuration, in a fresh memory cgroup of {} MiB (no swap): T threads \
         churn a 64 MiB working set of blocks of 64 KiB–2 MiB (log-uniform, one byte written \
         per page) — ops/s over {seconds} s, {}, is the throughput; then the churner peaks at \
         {} MiB, frees back to 64 MiB and keeps churning, and a neighbour (the OOM killer's \
         first choice) writes {} MiB at once, which fits only if the churner comes down to its \
         working set and at most {KEEP_MIB} MiB more. \"Returned within 1 s\": peak RSS \
         minus RSS 1 s after the neighbour started (RSS sampled every 10 ms); OOM kills are \
         summed over the runs. \"vs best as-shipped peer\": ops/s over the fastest peer with no \
         settings at the same thread count. Peers: {}. Huge-page settings read, as each \
         allocator reports them: {}; the last column is the churner's AnonHugePages at its \
         peak (THP here: {}). No published numbers for this scenario.",
        s.limit_mib,
        if reps == 1 {
            "one run".to_string()
        } else {
            format!("the median of {reps} runs")
        },
        s.peak_mib,
        s.neighbour_mib,
        if versions.is_empty() {
            "none installed".to_string()
        } else {
            versions.join(", ")
        },
        if verified.is_empty() {
            "none".to_string()
        } else {
            verified.join("; ")
        },
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .map_or("unknown".into(), |t| super::machine::selected(t.trim())),
    ));

    let mut cells: HashMap<(usize, usize), Cell> = HashMap::new();
    for (i, c) in configs.iter().enumerate() {
        let why = match (&c.preload, unread.get(&i)) {
            (Err(e), _) => Some(format!("skipped: {e}")),
            (_, Some(e)) => Some(format!("failed: {e}")),
            _ => None,
        };
        for &t in &threads {
            cells.entry((i, t)).or_default().failed = why.clone();
        }
    }
    let mut runs_csv = Csv::new(&[
        "allocator",
        "config",
        "threads",
        "run",
        "ops_per_s",
        "peak_rss_kb",
        "peak_anon_huge_kb",
        "rss_after_frees_kb",
        "rss_1s_kb",
        "returned_1s_kb",
        "oom_kills",
        "neighbour",
        "neighbour_ms",
        "ops_per_s_with_neighbour",
        "status",
    ]);
    let mut trace_csv = Csv::new(&[
        "allocator",
        "config",
        "threads",
        "run",
        "ms_since_neighbour_start",
        "churner_rss_kb",
    ]);
    for &t in &threads {
        for rep in 0..reps {
            for (i, c) in configs.iter().enumerate() {
                let cell = cells.entry((i, t)).or_default();
                if cell.failed.is_some() {
                    continue;
                }
                progress(format!(
                    "tradeoff: {} × {t}, run {}/{reps}",
                    c.name(),
                    rep + 1
                ));
                let lead = [
                    c.allocator.to_string(),
                    c.label.clone(),
                    t.to_string(),
                    (rep + 1).to_string(),
                ];
                match run_once(&exe, c, t, seconds, &s) {
                    Ok(r) => {
                        let (neighbour, ms) = match r.neighbour {
                            Neighbour::Got { ms } | Neighbour::GotThenKilled { ms } => {
                                (r.neighbour.kind().to_string(), format!("{ms:.1}"))
                            }
                            Neighbour::Ended(e) => (format!("ended: {e}"), String::new()),
                            o => (o.kind().to_string(), String::new()),
                        };
                        runs_csv.row(lead.iter().cloned().chain([
                            format!("{:.0}", r.ops_per_s),
                            r.peak_kb.to_string(),
                            r.peak_huge_kb.to_string(),
                            r.freed_kb.to_string(),
                            r.window_kb.to_string(),
                            format!("{:.0}", r.returned_kb()),
                            r.oom_kills.to_string(),
                            neighbour,
                            ms,
                            report::opt(r.after_ops_per_s, 0),
                            "ok".into(),
                        ]));
                        for &(ms, kb) in &r.trace {
                            trace_csv.row(
                                lead.iter()
                                    .cloned()
                                    .chain([format!("{ms:.1}"), kb.to_string()]),
                            );
                        }
                        cell.runs.push(r);
                    }
                    Err(e) => {
                        let lead: Vec<&str> = lead.iter().map(String::as_str).collect();
                        runs_csv.note(&lead, &format!("failed: {e}"));
                        cell.failed = Some(format!("failed: {e}"));
                    }
                }
            }
        }
    }

    let mut table = Table::new(&[
        "allocator",
        "config",
        "threads",
        "ops/s",
        "vs best as-shipped peer",
        "peak RSS",
        "RSS after frees",
        "RSS 1 s into the neighbour",
        "returned within 1 s",
        "OOM kills (all runs)",
        "neighbour",
        "huge pages at peak",
    ]);
    let mut csv = Csv::new(&[
        "allocator",
        "config",
        "kind",
        "threads",
        "runs",
        "ops_per_s",
        "vs_best_as_shipped",
        "peak_rss_mib",
        "rss_after_frees_mib",
        "rss_1s_mib",
        "returned_1s_mib",
        "oom_kills",
        "neighbour",
        "peak_anon_huge_mib",
        "status",
    ]);
    let mib = |v: f64| format!("{v:.0} MiB");
    let mut plots = Vec::new();
    for &t in &threads {
        let best = configs
            .iter()
            .enumerate()
            .filter(|(_, c)| c.kind == Kind::Default)
            .filter_map(|(i, _)| cells[&(i, t)].rate())
            .fold(None, |m: Option<f64>, r| Some(m.map_or(r, |m| m.max(r))));
        let mut points = Vec::new();
        for (i, c) in configs.iter().enumerate() {
            let cell = &cells[&(i, t)];
            let lead = vec![c.allocator.to_string(), c.label.clone(), t.to_string()];
            if let Some(why) = &cell.failed {
                let mut row = lead.clone();
                row.push(why.clone());
                table.row(row);
                let lead: Vec<&str> = lead.iter().map(String::as_str).collect();
                csv.note(&lead, why);
                continue;
            }
            let m = |f: &dyn Fn(&Run) -> f64| cell.median(f).unwrap_or(f64::NAN);
            let rate = m(&|r| r.ops_per_s);
            let vs = best.map(|b| rate / b);
            let (peak, freed, window, huge) = (
                m(&|r| r.peak_kb as f64) / 1024.0,
                m(&|r| r.freed_kb as f64) / 1024.0,
                m(&|r| r.window_kb as f64) / 1024.0,
                m(&|r| r.peak_huge_kb as f64) / 1024.0,
            );
            let returned = cell.returned_mib().unwrap_or(f64::NAN);
            let kills: u64 = cell.runs.iter().map(|r| r.oom_kills).sum();
            let mut row = lead.clone();
            row.extend([
                report::rate(rate),
                ratio(vs),
                mib(peak),
                mib(freed),
                mib(window),
                mib(returned),
                kills.to_string(),
                cell.neighbour(),
                mib(huge),
            ]);
            table.row(row);
            csv.row(
                [
                    c.allocator.to_string(),
                    c.label.clone(),
                    format!("{:?}", c.kind).to_lowercase(),
                ]
                .into_iter()
                .chain([
                    t.to_string(),
                    cell.runs.len().to_string(),
                    format!("{rate:.0}"),
                    report::opt(vs, 3),
                    format!("{peak:.1}"),
                    format!("{freed:.1}"),
                    format!("{window:.1}"),
                    format!("{returned:.1}"),
                    kills.to_string(),
                    cell.neighbour(),
                    format!("{huge:.1}"),
                    "ok".into(),
                ]),
            );
            points.push(Labelled {
                label: c.short(),
                note: match kills {
                    0 => String::new(),
                    1 => "(1 OOM kill)".into(),
                    n => format!("({n} OOM kills)"),
                },
                x: returned,
                y: rate,
            });
        }
        // The target corner: the best as-shipped peer's throughput and the memory the least
        // generous eager peer gave back.
        let eager = configs
            .iter()
            .enumerate()
            .filter(|(_, c)| c.kind == Kind::Eager)
            .filter_map(|(i, _)| cells[&(i, t)].returned_mib())
            .fold(None, |m: Option<f64>, r| Some(m.map_or(r, |m| m.min(r))));
        let target = best.zip(eager).map(|(y, x)| Target {
            x,
            y,
            caption: TARGET.into(),
        });
        let name = if t == threads[0] {
            "tradeoff.svg".to_string()
        } else {
            format!("tradeoff-{t}-threads.svg")
        };
        let freed_mib = s.peak_mib - STEADY_MIB;
        let svg = plot::scatter(
            &ctx.figure(format!(
                "throughput against memory returned under pressure, {t} thread{}",
                if t == 1 { "" } else { "s" }
            )),
            &Axis::linear(
                "memory returned within 1 s of the neighbour's start (MiB)",
                Unit::Plain,
            ),
            &Axis::linear("churn throughput (ops/s)", Unit::Count),
            &points,
            target.as_ref(),
            Some((freed_mib as f64, &format!("freed: {freed_mib} MiB"))),
        );
        plots.push((name, svg));
    }
    ctx.table(&table);
    for (name, svg) in &plots {
        report::write_file(&ctx.out, name, svg)?;
    }
    csv.write(&ctx.out, "tradeoff.csv")?;
    runs_csv.write(&ctx.out, "tradeoff-runs.csv")?;
    trace_csv.write(&ctx.out, "tradeoff-rss.csv")?;
    Ok(())
}
