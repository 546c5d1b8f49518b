//! markcost: the cost of one mark+unmark pair against range size, per vrange policy, next to
//! what raw madvise users pay to make memory discardable and then reuse it. No memory
//! pressure; the suite measures the caller's cost, not what reclaim does later.
//!
//! Methods (4 KiB pages: MADV_NOHUGEPAGE; every byte written before the first sample, so
//! every page is resident and its witness is its first word):
//! - `managed`, `hybrid`: `VolatileRegion::mark` + `unmark` (the arm delay is set to an hour,
//!   so hybrid ranges are never handed to the kernel during the run: a range in active use);
//! - `lazy`: the same on a lazy region (MADV_FREE at mark, a witness proof per page at unmark);
//! - `madv_free`: MADV_FREE, then one word written per page to dirty it again (reuse with no
//!   purge detection);
//! - `dontneed_refault`: MADV_DONTNEED, then one word written per page (a fault and a zeroed
//!   page each: what eager-purging allocators pay on reuse).
//!
//! Timer: iterations per sample calibrated so one sample takes at least a few milliseconds,
//! one warm-up sample discarded, the median of the samples' per-iteration times reported
//! (with the fastest and slowest sample in the CSV). The kernel path's pair (the classic call,
//! `Region`, 4 KiB and huge pages) is `crates/vrange/benches/classic.rs` (criterion).

use super::plot::{self, Axis, Series, Unit};
use super::report::{self, progress, Csv, Table};
use super::Ctx;
use std::time::{Duration, Instant};
use vrange::{Huge, Options, Policy, VolatileRegion};
use vrange_sys::mem;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;
const FILL: u8 = 0xA5;
const WORD: u64 = u64::from_ne_bytes([FILL; 8]);

const METHODS: [&str; 5] = ["managed", "hybrid", "lazy", "madv_free", "dontneed_refault"];

struct Measured {
    median_ns: f64,
    min_ns: f64,
    max_ns: f64,
    samples: usize,
    iters: u64,
    /// Pages unmark reported purged over the whole measurement (0 without pressure).
    purged: usize,
}

fn region(size: usize, policy: Policy) -> Result<VolatileRegion, String> {
    let r = VolatileRegion::new(
        size,
        Options {
            policy,
            huge: Huge::Never,
            ..Options::default()
        },
    )
    .map_err(|e| format!("VolatileRegion::new({size}): {e}"))?;
    // SAFETY: the region is ours and nothing refers into it.
    unsafe { r.as_ptr().write_bytes(FILL, r.len()) };
    Ok(r)
}

/// One word written per page: dirties each page again (and faults it in if it was dropped).
fn redirty(ptr: *mut u8, len: usize) {
    for off in (0..len).step_by(mem::page_size()) {
        // SAFETY: inside the suite's own region; page-aligned, so word-aligned.
        unsafe { ptr.add(off).cast::<u64>().write_volatile(WORD) };
    }
}

/// One mark+unmark pair (or its raw equivalent) on `r`; returns the pages reported purged.
fn pair(method: &str, r: &VolatileRegion) -> Result<usize, String> {
    match method {
        "managed" | "hybrid" | "lazy" => {
            // SAFETY: nothing refers into the region while it is volatile.
            unsafe { r.mark() }.map_err(|e| format!("mark: {e}"))?;
            Ok(r.unmark().map_err(|e| format!("unmark: {e}"))?.purged)
        }
        "madv_free" => {
            // SAFETY: the content may be lost; nothing reads it, and it is dirtied right after.
            unsafe { mem::purge_lazy(r.as_ptr(), r.len()) }
                .map_err(|e| format!("MADV_FREE: errno {e}"))?;
            redirty(r.as_ptr(), r.len());
            Ok(0)
        }
        "dontneed_refault" => {
            // SAFETY: the content is dropped; nothing reads it, and it is written right after.
            unsafe { mem::purge_forced(r.as_ptr(), r.len()) }
                .map_err(|e| format!("MADV_DONTNEED: errno {e}"))?;
            redirty(r.as_ptr(), r.len());
            Ok(0)
        }
        _ => unreachable!("unknown method {method}"),
    }
}

fn measure(method: &str, size: usize, quick: bool) -> Result<Measured, String> {
    let policy = match method {
        "hybrid" => Policy::Hybrid,
        "lazy" => Policy::Lazy,
        _ => Policy::Managed,
    };
    let r = region(size, policy)?;
    let target = if quick {
        Duration::from_micros(500)
    } else {
        Duration::from_millis(5)
    };
    let samples = match (quick, size) {
        (true, _) => 5,
        (false, s) if s <= 2 * MIB => 31,
        (false, s) if s <= 64 * MIB => 11,
        _ => 7,
    };
    let mut purged = 0;
    // Calibrate: double the iterations until a sample takes the target time.
    let mut iters: u64 = 1;
    loop {
        let t = Instant::now();
        for _ in 0..iters {
            purged += pair(method, &r)?;
        }
        if t.elapsed() >= target || iters >= 1 << 20 {
            break;
        }
        iters *= 2;
    }
    let mut per_iter = Vec::with_capacity(samples);
    for _ in 0..samples {
        let t = Instant::now();
        for _ in 0..iters {
            purged += pair(method, &r)?;
        }
        per_iter.push(t.elapsed().as_nanos() as f64 / iters as f64);
    }
    let min_ns = per_iter.iter().copied().fold(f64::INFINITY, f64::min);
    let max_ns = per_iter.iter().copied().fold(0.0, f64::max);
    Ok(Measured {
        median_ns: report::median(&mut per_iter).unwrap_or(f64::NAN),
        min_ns,
        max_ns,
        samples,
        iters,
        purged,
    })
}

pub fn run(ctx: &Ctx) -> Result<(), String> {
    // The pair cost of ranges in use: no arming, no pressure source purging meanwhile.
    for (name, value) in [
        ("VRANGE_ARM_DELAY_MS", "3600000"),
        ("VRANGE_PSI", "off"),
        ("VRANGE_VMPRESSURE", "off"),
        ("VRANGE_HEADROOM", "off"),
    ] {
        vrange::set_option(name, value).map_err(|e| format!("set {name}: {e}"))?;
    }
    let sizes: &[usize] = if ctx.quick() {
        &[4 * KIB, 64 * KIB, 2 * MIB]
    } else {
        &[4 * KIB, 64 * KIB, 2 * MIB, 64 * MIB, GIB]
    };
    ctx.say(
        "markcost: one mark+unmark pair per iteration, 4 KiB pages, no memory pressure; median \
         over samples of the per-iteration time (ns per 4 KiB page in parentheses). Published: \
         none for this measurement (the 2014 vrange() was O(1) to mark, MADV_FREE is O(pages)).",
    );
    let mut csv = Csv::new(&[
        "size_bytes",
        "method",
        "median_ns",
        "min_sample_ns",
        "max_sample_ns",
        "samples",
        "iterations_per_sample",
        "ns_per_4k_page",
        "pages_reported_purged",
    ]);
    let mut headers = vec!["size"];
    headers.extend(METHODS);
    headers.extend([
        "lazy / managed",
        "madv_free / managed",
        "dontneed_refault / managed",
    ]);
    let mut table = Table::new(&headers);
    let mut series: Vec<Series> = METHODS.iter().map(|m| Series::new(*m, vec![])).collect();
    let page = mem::page_size();
    let mut warnings = Vec::new();
    for &size in sizes {
        let mut medians = Vec::new();
        for (k, method) in METHODS.iter().enumerate() {
            progress(format!("markcost: {} {method}", report::size(size)));
            let m = measure(method, size, ctx.quick())?;
            if m.purged > 0 {
                warnings.push(format!(
                    "{method} at {}: {} pages reported purged (memory pressure during the run)",
                    report::size(size),
                    m.purged
                ));
            }
            let pages = (size / page).max(1) as f64;
            csv.row([
                size.to_string(),
                method.to_string(),
                format!("{:.1}", m.median_ns),
                format!("{:.1}", m.min_ns),
                format!("{:.1}", m.max_ns),
                m.samples.to_string(),
                m.iters.to_string(),
                format!("{:.2}", m.median_ns / pages),
                m.purged.to_string(),
            ]);
            series[k].points.push((size as f64, m.median_ns));
            medians.push(m.median_ns);
        }
        let pages = (size / page).max(1) as f64;
        let mut row = vec![report::size(size)];
        row.extend(
            medians
                .iter()
                .map(|&ns| format!("{} ({:.1})", report::ns(ns), ns / pages)),
        );
        for k in [2, 3, 4] {
            row.push(report::times(Some(medians[k] / medians[0])));
        }
        table.row(row);
    }
    ctx.table(&table);
    for w in &warnings {
        ctx.say(format!("markcost: WARNING: {w}"));
    }
    csv.write(&ctx.out, "markcost.csv")?;
    let svg = plot::lines(
        &ctx.figure("mark+unmark pair cost by range size, 4 KiB pages"),
        &Axis::log("range size (bytes)", Unit::Bytes),
        &Axis::log("time per mark+unmark pair (median)", Unit::Nanoseconds),
        &series,
    );
    report::write_file(&ctx.out, "markcost.svg", &svg)?;
    Ok(())
}
