//! pairs: the cost of one malloc+free pair of a large block (64 KiB, 512 KiB, 2 MiB), at 1
//! and 2 threads and oversubscribed (16 on the machine's cores), every allocator as shipped
//! in the same run.
//!
//! The workload is `c/pair.c` (built with vrange-bench, written into the output directory):
//! each thread loops malloc, write one byte, free. A cell is the median of five runs (one with
//! `--quick`); its cost is the CPU time the loops could use (their wall time times the threads
//! that could run at once) per pair.

use super::alloc::{self, Kind};
use super::report::{self, Csv, Table};
use super::Ctx;
use std::time::{Duration, Instant};
use vrange_testkit::proc::{clean_command, Exit, Proc};
use vrange_testkit::role::field;

const SIZES: [usize; 3] = [64 << 10, 512 << 10, 2 << 20];

fn size_label(size: usize) -> String {
    if size >= 1 << 20 {
        format!("{} MiB", size >> 20)
    } else {
        format!("{} KiB", size >> 10)
    }
}

/// One run: ns of CPU per pair.
fn run_once(
    exe: &std::path::Path,
    config: &alloc::Config,
    size: usize,
    threads: usize,
    seconds: f64,
    cores: usize,
) -> Result<f64, String> {
    let mut cmd = clean_command(exe);
    cmd.args(["-t", &threads.to_string(), "-s", &size.to_string()])
        .args(["-S", &seconds.to_string()]);
    config.apply(&mut cmd)?;
    let mut p = Proc::try_spawn(cmd)?;
    let line = p.line(
        "ns_per_pair=",
        Instant::now() + Duration::from_secs_f64(seconds + 60.0),
    );
    let exit = p.wait(Duration::from_secs(10));
    match (line, exit) {
        (Some(line), Exit::Code(0)) => {
            let pairs: f64 = field(&line, "pairs").ok_or("no pairs=")?;
            let wall: f64 = field(&line, "seconds").ok_or("no seconds=")?;
            let busy = threads.min(cores) as f64;
            Ok(wall * busy * 1e9 / pairs.max(1.0))
        }
        (_, exit) => Err(format!(
            "{exit}: {}",
            p.stderr().lines().last().unwrap_or("").trim()
        )),
    }
}

pub fn run(ctx: &Ctx) -> Result<(), String> {
    let quick = ctx.quick();
    let reps = ctx.args.reps.unwrap_or(if quick { 1 } else { 5 }).max(1);
    let seconds = ctx.args.seconds.unwrap_or(if quick { 0.1 } else { 0.3 });
    let cores = super::machine::cores();
    let threads = ctx.args.threads.clone().unwrap_or_else(|| vec![1, 2, 16]);
    let exe = super::workload::PAIR.install(&ctx.out)?;
    let mut versions = Vec::new();
    let configs: Vec<alloc::Config> = alloc::configs(ctx.lib(), &mut versions)
        .into_iter()
        .filter(|c| c.kind == Kind::Default || c.is_ours_default())
        .collect();
    ctx.say(format!(
        "pairs: each of T threads loops malloc(SIZE), write one byte, free for {seconds} s; \
         the cost is the CPU time the loops could use (wall time × min(T, {cores} cores)) per \
         pair, the median of {reps} runs. Every allocator as shipped (peers: {}); \
         vrange-malloc in its default mode (hybrid), whose per-CPU cache keeps up to 4 freed \
         blocks of up to 2 MiB per CPU for up to one reclaimer tick before they become \
         volatile.",
        if versions.is_empty() {
            "none installed".to_string()
        } else {
            versions.join(", ")
        }
    ));
    let mut headers = vec!["size".to_string(), "threads".to_string()];
    headers.extend(configs.iter().map(|c| c.allocator.to_string()));
    headers.push("vrange-malloc / glibc".into());
    let header_refs: Vec<&str> = headers.iter().map(String::as_str).collect();
    let mut table = Table::new(&header_refs);
    let mut csv = Csv::new(&["size", "threads", "allocator", "ns_per_pair"]);
    for &size in &SIZES {
        for &t in &threads {
            let mut cells = Vec::new();
            for c in &configs {
                let mut runs = Vec::new();
                let mut failed = None;
                for _ in 0..reps {
                    match run_once(&exe, c, size, t, seconds, cores) {
                        Ok(ns) => runs.push(ns),
                        Err(e) => {
                            failed = Some(e);
                            break;
                        }
                    }
                }
                let median = if failed.is_some() {
                    None
                } else {
                    report::median(&mut runs)
                };
                if let Some(ns) = median {
                    csv.row([
                        size.to_string(),
                        t.to_string(),
                        c.allocator.to_string(),
                        format!("{ns:.1}"),
                    ]);
                }
                cells.push((median, failed));
            }
            let glibc = cells.first().and_then(|c| c.0);
            let ours = configs
                .iter()
                .position(|c| c.kind == Kind::Ours)
                .and_then(|i| cells[i].0);
            let mut row = vec![size_label(size), t.to_string()];
            row.extend(cells.iter().zip(&configs).map(|((m, f), c)| match (m, f) {
                (Some(ns), _) => format!("{ns:.0} ns"),
                // Not installed here: said once, under the table.
                (None, Some(_)) if c.preload.is_err() => "–".into(),
                (None, Some(e)) => format!("failed: {e}"),
                (None, None) => "–".into(),
            }));
            row.push(match (ours, glibc) {
                (Some(o), Some(g)) => format!("{:.2}×", o / g),
                _ => "–".into(),
            });
            table.row(row);
            report::progress(format!("pairs: {} × {t} done", size_label(size)));
        }
    }
    ctx.table(&table);
    for c in &configs {
        if let Err(why) = &c.preload {
            ctx.say(format!("{}: – ({why})", c.allocator));
        }
    }
    csv.write(&ctx.out, "pairs.csv")?;
    Ok(())
}
