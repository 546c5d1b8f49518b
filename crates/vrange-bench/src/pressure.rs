//! pressure: memory a process has freed must not keep the next process out. Per allocator, in
//! a fresh child memory cgroup (384 MiB, no swap): a *peak* process allocates 300 MiB in
//! 96 KiB blocks (each followed by a small live block, so no allocator can simply trim its
//! heap), writes them, frees them and idles; after `IDLE` a *next* process allocates and writes
//! 250 MiB, so 166 MiB must leave the peak process. The next process makes itself the OOM
//! killer's first choice, so an allocator that keeps its free memory shows as the next process
//! killed. Then the peak process callocs its blocks again (memory given back must read zero).
//!
//! The C program is `c/peak_and_next.c` (built with vrange-bench), the one the
//! allocator's own pressure test (`crates/vrange-malloc/tests/pressure.rs`, glibc against
//! vrange-malloc) runs too; this suite runs it for every allocator and samples the peak
//! process's RSS every 10 ms while the next process runs (the plot). No published numbers
//! exist for this scenario.
//!
//! Needs root and a memory cgroup; skipped otherwise.

use super::alloc::{self, Config};
use super::plot::{self, Axis, Series, Unit};
use super::report::{self, progress, Csv, Table};
use super::Ctx;
use std::time::{Duration, Instant};
use vrange_testkit::proc::{clean_command, Exit, Proc};
use vrange_testkit::role::field;
use vrange_testkit::{cgroup, procfs};

/// Longer than vrange-malloc's arm delay (1 s), the same for every allocator.
pub(crate) const IDLE: Duration = Duration::from_millis(1500);
const DEADLINE: Duration = Duration::from_secs(30);

pub(crate) struct Sizes {
    pub(crate) limit_mib: u64,
    pub(crate) peak_mib: u64,
    pub(crate) next_mib: u64,
}

/// The suite's sizes (`--quick` halves them).
pub(crate) const FULL: Sizes = Sizes {
    limit_mib: 384,
    peak_mib: 300,
    next_mib: 250,
};

pub(crate) struct Outcome {
    pub(crate) next: Exit,
    pub(crate) next_ms: f64,
    pub(crate) oom_kills: u64,
    rss_done_kb: u64,
    pub(crate) rss_start_kb: u64,
    pub(crate) lazy_start_kb: u64,
    pub(crate) rss_end_kb: u64,
    pub(crate) max_usage: Option<u64>,
    pub(crate) peak: Exit,
    pub(crate) reused_nonzero: Option<u64>,
    /// (ms since the next process started, peak RSS MiB, cgroup usage MiB).
    trace: Vec<(f64, f64, f64)>,
}

/// One run of the scenario for allocator configuration `c` (`exe`: the installed
/// `peak_and_next` workload).
pub(crate) fn one(exe: &std::path::Path, c: &Config, s: &Sizes) -> Result<Outcome, String> {
    let cg = cgroup::try_child("vrange-bench-pressure", s.limit_mib << 20)?;
    let command = |args: &[String]| -> Result<Proc, String> {
        let mut cmd = clean_command(exe);
        cmd.args(args).env("VRANGE_STATS_DIR", "off");
        c.apply(&mut cmd)?;
        cgroup::join(&mut cmd, cg.cgroup())?;
        Proc::try_spawn(cmd)
    };
    let mut peak = command(&["peak".into(), s.peak_mib.to_string(), "96".into()])?;
    if peak.line("DONE", Instant::now() + DEADLINE).is_none() {
        let exit = peak.wait(Duration::from_secs(1));
        return Err(format!(
            "the peak process did not finish its peak ({exit}): {}",
            peak.stderr().trim()
        ));
    }
    let pid = peak.pid();
    let (rss_done_kb, _) = procfs::rss_lazy_kb(pid);
    std::thread::sleep(IDLE);
    let (rss_start_kb, lazy_start_kb) = procfs::rss_lazy_kb(pid);
    let started = Instant::now();
    let mut next = command(&[
        "next".into(),
        s.next_mib.to_string(),
        "1024".into(),
        "0".into(),
    ])?;
    let mut trace = Vec::new();
    let next_exit = loop {
        let (rss, _) = procfs::rss_lazy_kb(pid);
        let usage = cg.cgroup().usage().unwrap_or(0);
        trace.push((
            started.elapsed().as_secs_f64() * 1e3,
            rss as f64 / 1024.0,
            usage as f64 / (1 << 20) as f64,
        ));
        if let Some(e) = next.ended() {
            break e;
        }
        if started.elapsed() > DEADLINE {
            break next.wait(Duration::ZERO);
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let next_ms = started.elapsed().as_secs_f64() * 1e3;
    let oom_kills = cg.cgroup().oom_kills().unwrap_or(0);
    let max_usage = cgroup::peak(cg.cgroup());
    let (rss_end_kb, _) = procfs::rss_lazy_kb(pid);
    peak.close_stdin(); // end of input: reuse and exit
    let reused = peak.line("REUSED", Instant::now() + DEADLINE);
    let peak_exit = peak.wait(DEADLINE);
    drop((next, peak));
    drop(cg);
    Ok(Outcome {
        next: next_exit,
        next_ms,
        oom_kills,
        rss_done_kb,
        rss_start_kb,
        lazy_start_kb,
        rss_end_kb,
        max_usage,
        peak: peak_exit,
        reused_nonzero: reused.and_then(|l| field(&l, "nonzero")),
        trace,
    })
}

pub fn run(ctx: &Ctx) -> Result<(), String> {
    if !ctx.memory_cgroups("pressure") {
        return Ok(());
    }
    let s = if ctx.quick() {
        Sizes {
            limit_mib: 192,
            peak_mib: 150,
            next_mib: 125,
        }
    } else {
        FULL
    };
    let exe = super::workload::PEAK_AND_NEXT.install(&ctx.out)?;
    let mut versions = Vec::new();
    let mut configs = alloc::configs(ctx.lib(), &mut versions);
    if ctx.quick() {
        configs.retain(|c| c.allocator == "glibc" || c.is_ours_default());
    }
    ctx.say(format!(
        "pressure: a memory cgroup of {} MiB, no swap; the peak process frees {} MiB of 96 KiB \
         blocks and idles {} ms, then the next process needs {} MiB, so {} MiB must leave the \
         peak process. No published numbers for this scenario.",
        s.limit_mib,
        s.peak_mib,
        IDLE.as_millis(),
        s.next_mib,
        s.peak_mib + s.next_mib - s.limit_mib
    ));
    let mut table = Table::new(&[
        "allocator",
        "config",
        "next process",
        "next time",
        "OOM kills",
        "peak RSS: freed → at next start (LazyFree) → after next",
        "cgroup max usage",
        "peak reuse (calloc non-zero words)",
    ]);
    let mut csv = Csv::new(&[
        "allocator",
        "config",
        "next_exit",
        "next_ms",
        "oom_kills",
        "peak_rss_freed_kb",
        "peak_rss_at_next_kb",
        "peak_lazyfree_at_next_kb",
        "peak_rss_after_next_kb",
        "cgroup_max_usage_bytes",
        "peak_exit",
        "reuse_nonzero_words",
        "status",
    ]);
    let mut trace_csv = Csv::new(&[
        "allocator",
        "config",
        "ms_since_next_start",
        "peak_rss_mib",
        "cgroup_usage_mib",
    ]);
    let mut series = Vec::new();
    let mib = |kb: u64| format!("{:.0}", kb as f64 / 1024.0);
    for c in &configs {
        if let Err(why) = &c.preload {
            table.row(vec![
                c.allocator.into(),
                c.label.clone(),
                format!("skipped: {why}"),
            ]);
            csv.note(&[c.allocator, &c.label], &format!("skipped: {why}"));
            continue;
        }
        progress(format!("pressure: {}", c.name()));
        let o = one(&exe, c, &s)?;
        table.row(vec![
            c.allocator.into(),
            c.label.clone(),
            match o.next {
                Exit::Code(0) => "finished".into(),
                Exit::Signal(libc::SIGKILL) if o.oom_kills > 0 => "OOM-killed".into(),
                e => e.to_string(),
            },
            format!("{:.0} ms", o.next_ms),
            o.oom_kills.to_string(),
            format!(
                "{} → {} ({}) → {} MiB",
                mib(o.rss_done_kb),
                mib(o.rss_start_kb),
                mib(o.lazy_start_kb),
                mib(o.rss_end_kb)
            ),
            o.max_usage
                .map_or("?".into(), |b| format!("{} MiB", b >> 20)),
            match (o.peak, o.reused_nonzero) {
                (Exit::Code(_), Some(z)) => z.to_string(),
                (e, _) => format!("peak process: {e}"),
            },
        ]);
        csv.row([
            c.allocator.to_string(),
            c.label.clone(),
            o.next.to_string(),
            format!("{:.1}", o.next_ms),
            o.oom_kills.to_string(),
            o.rss_done_kb.to_string(),
            o.rss_start_kb.to_string(),
            o.lazy_start_kb.to_string(),
            o.rss_end_kb.to_string(),
            o.max_usage.map_or(String::new(), |b| b.to_string()),
            o.peak.to_string(),
            o.reused_nonzero.map_or(String::new(), |z| z.to_string()),
            "ok".into(),
        ]);
        for &(ms, rss, usage) in &o.trace {
            trace_csv.row([
                c.allocator.to_string(),
                c.label.clone(),
                format!("{ms:.1}"),
                format!("{rss:.1}"),
                format!("{usage:.1}"),
            ]);
        }
        series.push(Series::new(
            c.short(),
            o.trace.iter().map(|p| (p.0, p.1)).collect(),
        ));
    }
    ctx.table(&table);
    csv.write(&ctx.out, "pressure.csv")?;
    trace_csv.write(&ctx.out, "pressure-rss.csv")?;
    let svg = plot::lines(
        &ctx.figure("peak process RSS while the next process allocates"),
        &Axis::linear("time since the next process started (ms)", Unit::Plain),
        &Axis::linear("peak process RSS (MiB)", Unit::Plain),
        &series,
    );
    report::write_file(&ctx.out, "pressure.svg", &svg)?;
    Ok(())
}
