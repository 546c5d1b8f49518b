//! managed: the cost of one mark+unmark pair against range size for each policy, next to raw
//! madvise, with no memory pressure. Managed and hybrid marking is one atomic operation on the
//! range's state word, so its cost must stay flat from 4 KiB to 1 GiB; the lazy policy and raw
//! MADV_FREE pay per page.
//!
//! Methods (every page of the region written beforehand, 4 KiB pages, MADV_NOHUGEPAGE):
//! - `managed`, `hybrid`: `VolatileRegion::mark` + `unmark` (hybrid with the arm delay set to an
//!   hour, so ranges are never handed to the kernel during the run: the pair cost of a range in
//!   active use);
//! - `lazy`: the same on a lazy region (MADV_FREE + witness proof);
//! - `madv_free`: MADV_FREE, then one word written per page (reuse without purge detection).
//!
//! `VRANGE_BENCH_QUICK=1` runs 4 KiB, 2 MiB and 64 MiB with 10 samples (CI smoke test).

use vrange_testkit::bench::{criterion_dir, format_ns, fresh_median, size_label};

use criterion::{BenchmarkId, Criterion, SamplingMode};
use std::time::{Duration, SystemTime};
use vrange::{Huge, Options, Policy, VolatileRegion};
use vrange_sys::mem;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;

const METHODS: [&str; 4] = ["managed", "hybrid", "lazy", "madv_free"];

/// Prints a markdown table of this run's medians and managed's ratio to the others.
fn summary(sizes: &[usize], since: SystemTime) {
    let Some(dir) = criterion_dir() else { return };
    println!(
        "\n| size | managed | hybrid | lazy | madv_free | lazy / managed | madv_free / managed |"
    );
    println!("|---|---|---|---|---|---|---|");
    for &size in sizes {
        let label = size_label(size);
        let v: Vec<Option<f64>> = METHODS
            .iter()
            .map(|m| fresh_median(&dir, "managed", m, &label, since))
            .collect();
        let cell = |x: Option<f64>| x.map_or("-".to_string(), format_ns);
        let ratio = |x: Option<f64>| match (x, v[0]) {
            (Some(a), Some(b)) => format!("{:.0}×", a / b),
            _ => "-".to_string(),
        };
        println!(
            "| {label} | {} | {} | {} | {} | {} | {} |",
            cell(v[0]),
            cell(v[1]),
            cell(v[2]),
            cell(v[3]),
            ratio(v[2]),
            ratio(v[3])
        );
    }
}

fn region(size: usize, policy: Policy) -> VolatileRegion {
    let r = VolatileRegion::new(
        size,
        Options {
            policy,
            huge: Huge::Never,
            ..Options::default()
        },
    )
    .expect("region");
    // SAFETY: the region is ours and nothing refers into it.
    unsafe { r.as_ptr().write_bytes(0xA5, r.len()) };
    r
}

fn redirty(ptr: *mut u8, len: usize) {
    for off in (0..len).step_by(mem::page_size()) {
        // SAFETY: inside the benchmark's own mapping.
        unsafe { std::ptr::write_volatile(ptr.add(off).cast::<u64>(), 0xA5A5_A5A5_A5A5_A5A5) };
    }
}

fn main() {
    let quick = std::env::var_os("VRANGE_BENCH_QUICK").is_some();
    let since = SystemTime::now();
    for (name, value) in [
        ("VRANGE_ARM_DELAY_MS", "3600000"),
        ("VRANGE_PSI", "off"),
        ("VRANGE_VMPRESSURE", "off"),
        ("VRANGE_HEADROOM", "off"),
    ] {
        vrange::set_option(name, value).expect("option");
    }
    let sizes: &[usize] = if quick {
        &[4 * KIB, 2 * MIB, 64 * MIB]
    } else {
        &[4 * KIB, 64 * KIB, 2 * MIB, 64 * MIB, GIB]
    };
    let mut c = Criterion::default().configure_from_args();
    for &size in sizes {
        let mut g = c.benchmark_group("managed");
        let per_page = size > 64 * MIB;
        let samples = if quick || per_page { 10 } else { 50 };
        g.sample_size(samples)
            .measurement_time(Duration::from_secs(if quick { 1 } else { 3 }))
            .warm_up_time(Duration::from_millis(300));
        if per_page {
            g.sampling_mode(SamplingMode::Flat);
        }
        for policy in [Policy::Managed, Policy::Hybrid, Policy::Lazy] {
            let r = region(size, policy);
            g.bench_function(
                BenchmarkId::new(format!("{policy:?}").to_lowercase(), size_label(size)),
                |b| {
                    b.iter(|| {
                        // SAFETY: nothing refers into the region while it is volatile.
                        unsafe { r.mark().expect("mark") };
                        let u = r.unmark().expect("unmark");
                        assert_eq!(u.purged, 0, "no pressure: nothing may be purged");
                    })
                },
            );
        }
        let raw = region(size, Policy::Managed);
        g.bench_function(BenchmarkId::new(METHODS[3], size_label(size)), |b| {
            b.iter(|| {
                // SAFETY: the region's content is re-dirtied right after; nothing else reads it.
                unsafe { mem::purge_lazy(raw.as_ptr(), raw.len()).expect("MADV_FREE") };
                redirty(raw.as_ptr(), raw.len());
            })
        });
        g.finish();
    }
    c.final_summary();
    summary(sizes, since);
}
