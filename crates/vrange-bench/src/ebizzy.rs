//! ebizzy: allocator churn in the shape of ebizzy 0.3, every allocator in one run.
//!
//! The workload is `c/churn.c` (built with vrange-bench, written into the output directory):
//! T threads each pick a chunk of sorted 8-byte records (10 chunks of 512 KiB), malloc a
//! 512 KiB buffer, copy the chunk into it, binary-search a key in the copy and free the buffer.
//! Throughput is ebizzy's "records/s": searches per second, summed over threads. A freed
//! 512 KiB block that the allocator keeps dirty is reused without a fault; one it gives back
//! with MADV_DONTNEED faults in and zeroes 128 pages on the next iteration. `--classic`
//! reproduces ebizzy 0.3's generator, which never advances (every thread copies chunk 0), as
//! in the published runs.
//!
//! Each configuration (see `alloc`) runs the same binary with its allocator preloaded. Thread
//! counts: 1, 2, 4, ... and the core count (`--threads` to choose). Runs are interleaved (each
//! repetition runs every configuration once) so that drifting background load spreads over
//! all of them; cells are medians over `--reps` runs of `--seconds`. Faults are counted over
//! the timed loop, max RSS is the process peak; records per CPU-second (the worker threads'
//! own CPU time) show what the allocator costs when another process took a core from a run.
//!
//! `--pressure`: the workload runs in a child memory cgroup (256 MiB) where a second process
//! (this executable, `role hog`) holds all but 24 MiB and keeps touching it, so the
//! workload allocates below the headroom at which vrange's reclaimer starts purging.

use super::alloc::{self, Config, Kind};
use super::plot::{self, Axis, Unit};
use super::report::{self, progress, Csv, Table};
use super::Ctx;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};
use vrange_sys::cgroup::ChildCgroup;
use vrange_testkit::cgroup;
use vrange_testkit::hog::Hog;
use vrange_testkit::proc::{clean_command, Exit, Proc};
use vrange_testkit::role::field;

const PRESSURE_LIMIT: u64 = 256 << 20;
const PRESSURE_HEADROOM: u64 = 24 << 20;

/// Published ebizzy results (records/s = searches/s, other machines: compare ratios only).
/// (source, machine, threads, baseline label, baseline, improved label, improved).
type Published = (
    &'static str,
    &'static str,
    usize,
    &'static str,
    f64,
    &'static str,
    f64,
);
const PUBLISHED: [Published; 11] = [
    (
        "MADV_FREE commit 854e9ed0 (2015)",
        "12-vCPU KVM, ebizzy -S 10 -n 512",
        1,
        "jemalloc (MADV_DONTNEED)",
        2961.90,
        "jemalloc MADV_FREE",
        12069.70,
    ),
    (
        "MADV_FREE commit 854e9ed0 (2015)",
        "12-vCPU KVM, ebizzy -S 10 -n 512",
        2,
        "jemalloc (MADV_DONTNEED)",
        5020.00,
        "jemalloc MADV_FREE",
        17827.00,
    ),
    (
        "MADV_FREE commit 854e9ed0 (2015)",
        "12-vCPU KVM, ebizzy -S 10 -n 512",
        4,
        "jemalloc (MADV_DONTNEED)",
        8988.80,
        "jemalloc MADV_FREE",
        27930.80,
    ),
    (
        "MADV_FREE commit 854e9ed0 (2015)",
        "12-vCPU KVM, ebizzy -S 10 -n 512",
        8,
        "jemalloc (MADV_DONTNEED)",
        13036.50,
        "jemalloc MADV_FREE",
        33739.40,
    ),
    (
        "ELC 2014, Minchan Kim",
        "4 CPU, 2 GiB",
        1,
        "jemalloc vanilla",
        7436.0,
        "jemalloc old vrange",
        30231.0,
    ),
    (
        "ELC 2014, Minchan Kim",
        "4 CPU, 2 GiB",
        1,
        "jemalloc vanilla",
        7436.0,
        "jemalloc MADV_FREE",
        15292.0,
    ),
    (
        "ELC 2014, Minchan Kim",
        "4 CPU, 2 GiB",
        4,
        "jemalloc vanilla",
        16875.0,
        "jemalloc old vrange",
        56341.0,
    ),
    (
        "ELC 2014, Minchan Kim",
        "4 CPU, 2 GiB",
        4,
        "jemalloc vanilla",
        16875.0,
        "jemalloc MADV_FREE",
        36320.0,
    ),
    (
        "ELC 2014, Minchan Kim",
        "4 CPU, 2 GiB",
        8,
        "jemalloc vanilla",
        16966.0,
        "jemalloc old vrange",
        49239.0,
    ),
    (
        "vrange RFC v7 (2013)",
        "12 CPU, ebizzy -S 20 (12 threads)",
        12,
        "jemalloc vanilla",
        52389.0,
        "jemalloc vrange",
        203414.0,
    ),
    (
        "vrange RFC v7 (2013)",
        "same, with background memory pressure",
        12,
        "jemalloc vanilla",
        40746.0,
        "jemalloc vrange",
        174910.0,
    ),
];

/// One run's line from churn.c.
#[derive(Clone, Copy)]
struct Run {
    records_per_s: f64,
    iterations: u64,
    seconds: f64,
    cpu_seconds: f64,
    minflt: u64,
    maxrss_kb: u64,
}

impl Run {
    fn records_per_cpu_s(&self) -> f64 {
        self.iterations as f64 / self.cpu_seconds.max(1e-9)
    }

    fn parse(line: &str) -> Option<Run> {
        Some(Run {
            records_per_s: field(line, "records_per_s")?,
            iterations: field(line, "iterations")?,
            seconds: field(line, "seconds")?,
            cpu_seconds: field(line, "cpu_seconds")?,
            minflt: field(line, "minflt")?,
            maxrss_kb: field(line, "maxrss_kb")?,
        })
    }
}

/// The runs of one configuration at one thread count.
type Cell = report::Cell<Run>;

impl Cell {
    fn rate(&self) -> Option<f64> {
        self.median(|r| r.records_per_s)
    }
}

struct Workload {
    exe: std::path::PathBuf,
    chunks: usize,
    chunk_size: usize,
    seconds: f64,
    classic: bool,
}

/// Runs the workload once under `config`; kills it if it runs far past its time.
fn run_once(
    w: &Workload,
    config: &Config,
    threads: usize,
    cgroup: Option<&ChildCgroup>,
) -> Result<Run, String> {
    let mut cmd = clean_command(&w.exe);
    cmd.args(["-t", &threads.to_string(), "-n", &w.chunks.to_string()])
        .args([
            "-s",
            &w.chunk_size.to_string(),
            "-S",
            &w.seconds.to_string(),
        ]);
    if w.classic {
        cmd.arg("-c");
    }
    config.apply(&mut cmd)?;
    if let Some(cg) = cgroup {
        cgroup::join(&mut cmd, cg.cgroup())?;
    }
    let mut p = Proc::try_spawn(cmd)?;
    let line = p.line(
        "records_per_s=",
        Instant::now() + Duration::from_secs_f64(w.seconds + 60.0),
    );
    let exit = p.wait(Duration::from_secs(10));
    match (line, exit) {
        (Some(line), Exit::Code(0)) => {
            Run::parse(&line).ok_or_else(|| format!("unreadable output: {line:?}"))
        }
        (_, exit) => {
            let err = p.stderr();
            Err(format!(
                "{exit}: {}",
                err.lines().last().unwrap_or("").trim()
            ))
        }
    }
}

fn thread_counts(cores: usize) -> Vec<usize> {
    let mut v: Vec<usize> = (0..).map(|k| 1 << k).take_while(|&t| t < cores).collect();
    v.push(cores);
    v
}

/// The machine's load averages over 1, 5 and 15 minutes, as uptime(1) prints them.
fn load() -> String {
    vrange_sys::procfs::loadavg().map_or("?".into(), |l| {
        format!("{:.2} {:.2} {:.2}", l.one, l.five, l.fifteen)
    })
}

/// The memory hog of `--pressure`: holds BYTES, says "ready", then keeps touching them (one
/// word per page every 100 ms) until killed.
pub fn hog_role(args: &[String]) -> i32 {
    let Some(bytes) = args.first().and_then(|b| b.parse::<usize>().ok()) else {
        eprintln!("usage: vrange-bench role hog BYTES");
        return 2;
    };
    let Ok(mut hog) = Hog::new(bytes) else {
        eprintln!("hog: cannot map {bytes} bytes");
        return 1;
    };
    hog.hold(bytes);
    println!("ready");
    let mut round = 1u8;
    loop {
        std::thread::sleep(Duration::from_millis(100));
        round = round.wrapping_add(1);
        hog.touch_again(round | 1);
    }
}

/// The cgroup and running hog of `--pressure`.
fn start_pressure() -> Result<(ChildCgroup, Proc), String> {
    let cg = cgroup::try_child("vrange-bench-ebizzy", PRESSURE_LIMIT)?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = clean_command(&exe);
    cmd.args([
        "role",
        "hog",
        &(PRESSURE_LIMIT - PRESSURE_HEADROOM).to_string(),
    ]);
    cgroup::join(&mut cmd, cg.cgroup())?;
    let hog = Proc::try_spawn(cmd)?;
    if hog
        .line("ready", Instant::now() + Duration::from_secs(30))
        .is_none()
    {
        return Err("the memory hog did not start".into());
    }
    Ok((cg, hog))
}

pub fn run(ctx: &Ctx) -> Result<(), String> {
    let a = &ctx.args;
    let quick = ctx.quick();
    let reps = a.reps.unwrap_or(if quick { 1 } else { 5 }).max(1);
    let cores = super::machine::cores();
    let threads = a.threads.clone().unwrap_or_else(|| thread_counts(cores));
    let chunk_size = a.chunk_size.unwrap_or(512 << 10);
    let w = Workload {
        exe: super::workload::CHURN.install(&ctx.out)?,
        chunks: a.chunks.unwrap_or(10),
        chunk_size,
        seconds: a.seconds.unwrap_or(if quick { 0.3 } else { 2.0 }),
        classic: a.classic,
    };
    let mut versions = Vec::new();
    let configs = alloc::configs(ctx.lib(), &mut versions);
    let pressure = if a.pressure {
        match start_pressure() {
            Ok(p) => Some(p),
            Err(why) => {
                ctx.skipped("ebizzy --pressure", &why);
                None
            }
        }
    } else {
        None
    };
    let load_before = load();
    let mut cells: HashMap<(usize, usize), Cell> = HashMap::new();
    for rep in 1..=reps {
        for &t in &threads {
            for (i, c) in configs.iter().enumerate() {
                if c.preload.is_err() {
                    continue;
                }
                let cell = cells.entry((i, t)).or_default();
                if cell.failed.is_some() {
                    continue;
                }
                let result = run_once(&w, c, t, pressure.as_ref().map(|p| &p.0));
                progress(format!(
                    "ebizzy: run {rep}/{reps}, {t} thread(s), {}: {}",
                    c.name(),
                    match &result {
                        Ok(r) => format!(
                            "{} records/s, {} faults",
                            report::rate(r.records_per_s),
                            r.minflt
                        ),
                        Err(e) => format!("failed: {e}"),
                    }
                ));
                match result {
                    Ok(r) => cell.runs.push(r),
                    Err(e) => cell.failed = Some(format!("run {rep}: {e}")),
                }
            }
        }
    }
    let pressure_note = match &pressure {
        Some((cg, _)) => format!(
            "; under pressure: in a {} MiB memory cgroup with a second process holding {} MiB (OOM kills {})",
            PRESSURE_LIMIT >> 20,
            (PRESSURE_LIMIT - PRESSURE_HEADROOM) >> 20,
            cg.cgroup().oom_kills().map_or("?".into(), |k| k.to_string())
        ),
        None => String::new(),
    };
    drop(pressure);
    ctx.say(format!(
        "ebizzy: {} chunks of {}, {} generator, median of {reps} run(s) of {} s per cell; \
         records/s as ebizzy counts them (one per search); peers: {}; load average before {}, after {}{pressure_note}",
        w.chunks,
        report::size(w.chunk_size),
        if w.classic { "ebizzy 0.3's never-advancing (every thread copies chunk 0)" } else { "a per-thread advancing" },
        w.seconds,
        if versions.is_empty() { "none installed".to_string() } else { versions.join(", ") },
        load_before,
        load(),
    ));
    let results = Results {
        configs: &configs,
        threads: &threads,
        cells: &cells,
    };
    let (csv, runs_csv) = results.table(ctx);
    results.published(ctx, w.classic);
    csv.write(&ctx.out, "ebizzy.csv")?;
    runs_csv.write(&ctx.out, "ebizzy-runs.csv")?;
    let ran: Vec<usize> = (0..configs.len())
        .filter(|&i| configs[i].preload.is_ok())
        .collect();
    let svg = plot::bars(
        &ctx.figure("ebizzy records/s (median) by thread count"),
        &ran.iter().map(|&i| configs[i].short()).collect::<Vec<_>>(),
        &Axis::linear("records/s (median)", Unit::Count),
        &threads
            .iter()
            .map(|&t| {
                (
                    format!("{t} thread(s)"),
                    ran.iter().map(|&i| results.rate(i, t)).collect(),
                )
            })
            .collect::<Vec<_>>(),
    );
    report::write_file(&ctx.out, "ebizzy.svg", &svg)?;
    let failed: Vec<&String> = cells.values().filter_map(|c| c.failed.as_ref()).collect();
    if !failed.is_empty() {
        return Err(format!(
            "{} cell(s) failed, first: {}",
            failed.len(),
            failed[0]
        ));
    }
    Ok(())
}

struct Results<'a> {
    configs: &'a [Config],
    threads: &'a [usize],
    cells: &'a HashMap<(usize, usize), Cell>,
}

impl Results<'_> {
    fn rate(&self, i: usize, t: usize) -> Option<f64> {
        self.cells.get(&(i, t))?.rate()
    }

    fn find(&self, f: impl Fn(&Config) -> bool) -> Option<usize> {
        self.configs.iter().position(f)
    }

    /// The default peer with the highest median records/s at `t` threads.
    fn best_default(&self, t: usize) -> Option<usize> {
        (0..self.configs.len())
            .filter(|&i| self.configs[i].kind == Kind::Default)
            .filter_map(|i| Some((i, self.rate(i, t)?)))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .map(|(i, _)| i)
    }

    /// Prints the main table; returns the medians and the runs as CSV.
    fn table(&self, ctx: &Ctx) -> (Csv, Csv) {
        let mut table = Table::new(&[
            "allocator",
            "config",
            "threads",
            "median records/s",
            "records/CPU-s",
            "vs glibc",
            "vs best default peer",
            "vs jemalloc eager",
            "minor faults per search",
            "max RSS",
        ]);
        let mut csv = Csv::new(&[
            "allocator",
            "config",
            "threads",
            "median_records_per_s",
            "median_records_per_cpu_s",
            "ratio_glibc",
            "ratio_best_default",
            "ratio_jemalloc_eager",
            "median_minflt_per_search",
            "median_maxrss_kb",
            "runs",
            "status",
        ]);
        let mut runs = Csv::new(&[
            "allocator",
            "config",
            "threads",
            "run",
            "records_per_s",
            "iterations",
            "seconds",
            "cpu_seconds",
            "minflt",
            "maxrss_kb",
        ]);
        let glibc = self.find(|c| c.allocator == "glibc");
        let je_eager = self.find(|c| c.allocator == "jemalloc" && c.kind == Kind::Eager);
        let ratio = |a: Option<f64>, b: Option<f64>| Some(a? / b?);
        for (i, c) in self.configs.iter().enumerate() {
            if let Err(why) = &c.preload {
                table.row(vec![
                    c.allocator.into(),
                    c.label.clone(),
                    "–".into(),
                    format!("skipped: {why}"),
                ]);
                csv.note(&[c.allocator, &c.label], &format!("skipped: {why}"));
                continue;
            }
            for &t in self.threads {
                let Some(cell) = self.cells.get(&(i, t)) else {
                    continue;
                };
                for (k, r) in cell.runs.iter().enumerate() {
                    runs.row([
                        c.allocator.to_string(),
                        c.label.clone(),
                        t.to_string(),
                        (k + 1).to_string(),
                        format!("{:.0}", r.records_per_s),
                        r.iterations.to_string(),
                        format!("{:.3}", r.seconds),
                        format!("{:.3}", r.cpu_seconds),
                        r.minflt.to_string(),
                        r.maxrss_kb.to_string(),
                    ]);
                }
                if let Some(e) = &cell.failed {
                    table.row(vec![
                        c.allocator.into(),
                        c.label.clone(),
                        t.to_string(),
                        format!("failed: {e}"),
                    ]);
                    csv.note(
                        &[c.allocator, &c.label, &t.to_string()],
                        &format!("failed: {e}"),
                    );
                    continue;
                }
                let median = cell.rate();
                let cpu = cell.median(Run::records_per_cpu_s);
                let vs_glibc = ratio(median, glibc.and_then(|g| self.rate(g, t)));
                let vs_best = ratio(median, self.best_default(t).and_then(|b| self.rate(b, t)));
                let vs_eager = ratio(median, je_eager.and_then(|e| self.rate(e, t)));
                let per = cell.median(|r| r.minflt as f64 / r.iterations.max(1) as f64);
                let rss = cell.median(|r| r.maxrss_kb as f64);
                table.row(vec![
                    c.allocator.into(),
                    c.label.clone(),
                    t.to_string(),
                    median.map_or("–".into(), report::rate),
                    cpu.map_or("–".into(), report::rate),
                    report::times(vs_glibc),
                    report::times(vs_best),
                    report::times(vs_eager),
                    report::opt(per, 2),
                    rss.map_or("–".into(), |k| format!("{:.1} MiB", k / 1024.0)),
                ]);
                csv.row([
                    c.allocator.to_string(),
                    c.label.clone(),
                    t.to_string(),
                    report::opt(median, 0),
                    report::opt(cpu, 0),
                    report::opt(vs_glibc, 4),
                    report::opt(vs_best, 4),
                    report::opt(vs_eager, 4),
                    report::opt(per, 3),
                    report::opt(rss, 0),
                    cell.runs.len().to_string(),
                    "ok".into(),
                ]);
            }
        }
        ctx.table(&table);
        (csv, runs)
    }

    /// The published results beside ours: the same comparison (an allocator that keeps freed
    /// memory against jemalloc purging at every free) as ratios, since the machines differ.
    fn published(&self, ctx: &Ctx, classic: bool) {
        let je_eager = self.find(|c| c.allocator == "jemalloc" && c.kind == Kind::Eager);
        let lazy = self.find(|c| c.kind == Kind::Ours && c.env.iter().any(|(_, v)| v == "lazy"));
        let hybrid = self.find(Config::is_ours_default);
        let mut t = Table::new(&[
            "published",
            "machine",
            "threads",
            "baseline",
            "records/s",
            "improved",
            "records/s",
            "published ratio",
            "ours: threads",
            "ours: vrange-malloc lazy / jemalloc eager",
            "ours: vrange-malloc hybrid / jemalloc eager",
        ]);
        let max = self.threads.iter().copied().max().unwrap_or(1);
        for (src, machine, threads, base, b, imp, v) in PUBLISHED {
            let ours_t = if self.threads.contains(&threads) {
                threads
            } else {
                max
            };
            let r = |i: Option<usize>| {
                let (i, e) = (i?, je_eager?);
                Some(self.rate(i, ours_t)? / self.rate(e, ours_t)?)
            };
            t.row(vec![
                src.into(),
                machine.into(),
                threads.to_string(),
                base.into(),
                format!("{b:.0}"),
                imp.into(),
                format!("{v:.0}"),
                report::times(Some(v / b)),
                if ours_t == threads {
                    ours_t.to_string()
                } else {
                    format!("{ours_t} (max here)")
                },
                report::times(r(lazy)),
                report::times(r(hybrid)),
            ]);
        }
        let mut note = String::new();
        let _ = write!(
            note,
            "Published ebizzy runs used ebizzy 0.3's never-advancing generator (--classic here) \
             and jemalloc builds of their time; \"vanilla\" jemalloc then purged with MADV_DONTNEED, \
             as `MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0` does here. This run: {}.",
            if classic {
                "--classic, as published"
            } else {
                "the advancing generator (add --classic for the published shape)"
            }
        );
        ctx.say(format!("ebizzy: published results next to ours (ratios carry over, absolute rates do not). {note}"));
        ctx.table(&t);
    }
}
