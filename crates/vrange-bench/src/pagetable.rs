//! pagetable: the page tables left behind by touching and freeing 50 GiB, 2 MiB at a time
//! (Qi Zheng's experiment from the PTE-freeing series: mmap 50 GiB, then for each 2 MiB touch
//! it and MADV_DONTNEED it; VmPTE 102,640 kB before the series, 248 kB after).
//!
//! Each method runs in a process of its own (this executable, `vrange-bench role pagetable
//! METHOD BLOCKS`) inside a child memory cgroup limited to 1 GiB, with 4 KiB pages (THP off:
//! a huge page has no PTE table to leave behind). VmPTE is read from /proc/self/status every
//! 512 blocks (the maximum) and at the end.
//! - `madv_dontneed`: raw MADV_DONTNEED of each block once touched (the experiment itself);
//! - `madv_free`: raw MADV_FREE of each block; the pages go when the cgroup's limit makes the
//!   kernel reclaim them, the page tables stay;
//! - `vrange-malloc hybrid` / `lazy`: all blocks allocated first (50 GiB of address space), then
//!   each touched and freed. Hybrid purges a whole free chunk with one MADV_DONTNEED over its
//!   PMD; lazy frees with MADV_FREE alone. `VRANGE_MALLOC_THP=never`,
//!   `VRANGE_MALLOC_BUDGET=64M` (as `crates/vrange-malloc/tests/pagetable.rs`).
//!
//! Without a memory cgroup the MADV_FREE methods are skipped (lazily freed pages would only
//! go under pressure on the whole machine); the others run unconfined.

use super::plot::{self, Axis, Unit};
use super::report::{self, progress, Csv, Table};
use super::Ctx;
use std::time::{Duration, Instant};
use vrange_sys::mem;
use vrange_testkit::cgroup;
use vrange_testkit::proc::{clean_command, Proc};
use vrange_testkit::role::field;

const BLOCK: usize = 2 << 20;
const BLOCKS: usize = 25_600;
const METHODS: [(&str, &str); 4] = [
    ("madv_dontneed", "raw MADV_DONTNEED per 2 MiB block"),
    (
        "madv_free",
        "raw MADV_FREE per block; reclaim under the cgroup limit",
    ),
    ("hybrid", "vrange-malloc hybrid: free chunks purged whole"),
    ("lazy", "vrange-malloc lazy: MADV_FREE at free"),
];
const PUBLISHED_BEFORE_KB: u64 = 102_640;
const PUBLISHED_AFTER_KB: u64 = 248;

fn status() -> vrange_sys::procfs::Status {
    vrange_sys::procfs::status(None).unwrap_or_default()
}

/// The loop, in the role process: prints `done vmpte_kb=... max_vmpte_kb=... rss_kb=...
/// secs=...`.
pub fn role(args: &[String]) -> i32 {
    let (Some(method), Some(n)) = (
        args.first(),
        args.get(1).and_then(|n| n.parse::<usize>().ok()),
    ) else {
        eprintln!("usage: vrange-bench role pagetable METHOD BLOCKS");
        return 2;
    };
    let page = mem::page_size();
    let t0 = Instant::now();
    let mut max_pte = 0;
    let touch = |b: *mut u8| {
        for off in (0..BLOCK).step_by(page) {
            // SAFETY: b is a live 2 MiB block owned by this loop.
            unsafe { b.add(off).write_volatile(1) };
        }
    };
    match method.as_str() {
        "madv_dontneed" | "madv_free" => {
            let Ok(base) = mem::map_anon(n * BLOCK, BLOCK) else {
                eprintln!("cannot map {} blocks", n);
                return 1;
            };
            if let Err(e) = mem::advise_huge(base.as_ptr(), n * BLOCK, false) {
                eprintln!("MADV_NOHUGEPAGE: errno {e}");
                return 1;
            }
            for i in 0..n {
                let b = base.as_ptr().wrapping_add(i * BLOCK);
                touch(b);
                // SAFETY: the block's content is never read again.
                let r = unsafe {
                    if method == "madv_free" {
                        mem::purge_lazy(b, BLOCK)
                    } else {
                        mem::purge_forced(b, BLOCK)
                    }
                };
                if let Err(e) = r {
                    eprintln!("madvise: errno {e}");
                    return 1;
                }
                if i % 512 == 0 {
                    max_pte = max_pte.max(status().vm_pte_kb);
                }
            }
        }
        "hybrid" | "lazy" => {
            use vrange_malloc::heap;
            let mut blocks = Vec::with_capacity(n);
            for _ in 0..n {
                match heap::alloc(BLOCK, 16) {
                    Some(b) => blocks.push(b.ptr.as_ptr()),
                    None => {
                        eprintln!("vrange-malloc: allocation {} failed", blocks.len());
                        return 1;
                    }
                }
            }
            for (i, &b) in blocks.iter().enumerate() {
                touch(b);
                // SAFETY: live, freed once.
                if !unsafe { heap::free(b) } {
                    eprintln!("vrange-malloc: free refused");
                    return 1;
                }
                if i % 512 == 0 {
                    max_pte = max_pte.max(status().vm_pte_kb);
                }
            }
            // Let the reclaimer finish what the last frees asked of it.
            let deadline = Instant::now() + Duration::from_secs(10);
            while vrange::stats().volatile_bytes > 64 << 20 && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        other => {
            eprintln!("unknown method {other}");
            return 2;
        }
    }
    let s = status();
    println!(
        "done vmpte_kb={} max_vmpte_kb={} rss_kb={} secs={:.2}",
        s.vm_pte_kb,
        max_pte.max(s.vm_pte_kb),
        s.vm_rss_kb,
        t0.elapsed().as_secs_f64()
    );
    0
}

struct Outcome {
    vmpte_kb: u64,
    max_vmpte_kb: u64,
    rss_kb: u64,
    secs: f64,
    oom_kills: Option<u64>,
}

fn run_method(method: &str, blocks: usize, limit: u64) -> Result<Result<Outcome, String>, String> {
    let cgroup = cgroup::try_child("vrange-bench-pt", limit);
    if cgroup.is_err() && (method == "madv_free" || method == "lazy") {
        return Ok(Err(format!(
            "{}; lazily freed pages go only under a memory limit (without one, the whole \
             machine would have to run short first)",
            cgroup.err().unwrap_or_default()
        )));
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = clean_command(&exe);
    cmd.args(["role", "pagetable", method, &blocks.to_string()])
        .env("VRANGE_MALLOC_THP", "never")
        .env("VRANGE_MALLOC_BUDGET", "64M")
        .env("VRANGE_STATS_DIR", "off");
    if method == "hybrid" || method == "lazy" {
        cmd.env("VRANGE_MALLOC_MODE", method);
    }
    if let Ok(cg) = &cgroup {
        cgroup::join(&mut cmd, cg.cgroup())?;
    }
    let mut p = Proc::try_spawn(cmd)?;
    let line = p.line("done", Instant::now() + Duration::from_secs(900));
    let exit = p.wait(Duration::from_secs(30));
    let oom_kills = cgroup
        .as_ref()
        .ok()
        .and_then(|c| c.cgroup().oom_kills().ok());
    let Some(line) = line else {
        return Err(format!(
            "{method}: the loop did not finish ({exit}; OOM kills {oom_kills:?}): {}",
            p.stderr().trim()
        ));
    };
    let get = |k| field::<u64>(&line, k).ok_or_else(|| format!("{method}: no {k} in {line:?}"));
    Ok(Ok(Outcome {
        vmpte_kb: get("vmpte_kb")?,
        max_vmpte_kb: get("max_vmpte_kb")?,
        rss_kb: get("rss_kb")?,
        secs: field(&line, "secs").unwrap_or(f64::NAN),
        oom_kills,
    }))
}

pub fn run(ctx: &Ctx) -> Result<(), String> {
    let blocks = ctx
        .args
        .blocks
        .unwrap_or(if ctx.quick() { 512 } else { BLOCKS });
    // The quick run's 1 GiB would fit under a 1 GiB limit: a smaller one makes the MADV_FREE
    // methods reclaim as the full run does.
    let limit: u64 = if ctx.quick() { 256 << 20 } else { 1 << 30 };
    ctx.say(format!(
        "pagetable: {blocks} blocks of 2 MiB ({} of address space) touched (4 KiB pages) and \
         freed, each method in a process of its own in a memory cgroup limited to {}; one 4 KiB \
         page-table page maps 2 MiB, so keeping every table costs {}. Published (Qi Zheng, \
         \"Free user PTE page table pages\", 2021, MADV_DONTNEED loop over 50 GiB): VmPTE {} \
         before the series, {} after.",
        report::size(blocks * BLOCK),
        report::size(limit as usize),
        report::kb(blocks as u64 * 4),
        report::kb(PUBLISHED_BEFORE_KB),
        report::kb(PUBLISHED_AFTER_KB),
    ));
    let mut table = Table::new(&[
        "method",
        "VmPTE at the end",
        "VmPTE max",
        "tables kept (of one per block)",
        "VmRSS at the end",
        "time",
        "OOM kills",
        "published VmPTE (MADV_DONTNEED loop)",
    ]);
    let mut csv = Csv::new(&[
        "method",
        "blocks",
        "cgroup_limit_bytes",
        "vmpte_kb",
        "max_vmpte_kb",
        "rss_kb",
        "seconds",
        "oom_kills",
        "status",
    ]);
    let mut bars = Vec::new();
    for (method, what) in METHODS {
        progress(format!("pagetable: {method} ({blocks} blocks)"));
        match run_method(method, blocks, limit)? {
            Ok(o) => {
                let published = if method == "madv_dontneed" {
                    format!(
                        "{} before, {} after the series",
                        report::kb(PUBLISHED_BEFORE_KB),
                        report::kb(PUBLISHED_AFTER_KB)
                    )
                } else {
                    "–".into()
                };
                table.row(vec![
                    what.into(),
                    report::kb(o.vmpte_kb),
                    report::kb(o.max_vmpte_kb),
                    format!("{:.1} %", o.vmpte_kb as f64 / (blocks as f64 * 4.0) * 100.0),
                    format!("{:.0} MiB", o.rss_kb as f64 / 1024.0),
                    format!("{:.1} s", o.secs),
                    o.oom_kills.map_or("no cgroup".into(), |k| k.to_string()),
                    published,
                ]);
                csv.row([
                    method.to_string(),
                    blocks.to_string(),
                    limit.to_string(),
                    o.vmpte_kb.to_string(),
                    o.max_vmpte_kb.to_string(),
                    o.rss_kb.to_string(),
                    format!("{:.2}", o.secs),
                    o.oom_kills.map_or(String::new(), |k| k.to_string()),
                    "ok".into(),
                ]);
                bars.push((
                    method.to_string(),
                    Some(o.vmpte_kb as f64),
                    Some(o.max_vmpte_kb as f64),
                ));
            }
            Err(why) => {
                ctx.skipped(&format!("pagetable {method}"), &why);
                table.row(vec![what.into(), format!("skipped: {why}")]);
                csv.note(
                    &[method, &blocks.to_string(), &limit.to_string()],
                    &format!("skipped: {why}"),
                );
            }
        }
    }
    ctx.table(&table);
    csv.write(&ctx.out, "pagetable.csv")?;
    bars.push((
        "published before".into(),
        Some(PUBLISHED_BEFORE_KB as f64),
        None,
    ));
    bars.push((
        "published after".into(),
        Some(PUBLISHED_AFTER_KB as f64),
        None,
    ));
    let categories: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    let svg = plot::bars(
        &ctx.figure(format!(
            "VmPTE after {} touched and freed",
            report::size(blocks * BLOCK)
        )),
        &categories,
        &Axis::log("VmPTE (kB)", Unit::Plain),
        &[
            ("at the end".into(), bars.iter().map(|b| b.1).collect()),
            ("maximum".into(), bars.iter().map(|b| b.2).collect()),
        ],
    );
    report::write_file(&ctx.out, "pagetable.svg", &svg)?;
    Ok(())
}
