//! classic: the cost of one mark+unmark pair on the kernel purge path (the classic call and
//! [`Region`]), with no memory pressure, compared with what raw madvise users pay to make memory
//! discardable and reuse it. The managed, hybrid and lazy policies' pair cost is
//! `vrange-bench markcost`.
//!
//! Methods, per page kind and range size (every page written with a non-zero pattern before
//! the group, so pages are resident and every page's witness is its first word):
//! - `vrange-region`: [`Region::mark_volatile`] + [`Region::unmark`] (no mapping check);
//! - `vrange-any`: [`vrange::mark_volatile`] + [`vrange::unmark`] on a plain mapping (each does
//!   the PROCMAP_QUERY range check);
//! - `madv_free`: MADV_FREE, then one word written per 4 KiB page to make the pages dirty again
//!   (what raw MADV_FREE users must do before reuse; no purge detection);
//! - `dontneed_refault`: MADV_DONTNEED, then one word written per 4 KiB page (refault and
//!   zeroing: what eager-purging allocators pay).
//!
//! Every iteration leaves the range pinned and resident. Page kinds: `4k` (MADV_NOHUGEPAGE) and
//! `thp` (2 MiB-aligned, MADV_HUGEPAGE; sizes of 2 MiB and more; checked in /proc/self/smaps).
//!
//! `VRANGE_BENCH_QUICK=1` runs only 4 KiB and 2 MiB with 10 samples of 1 s (CI smoke test).
//! After the run, a table of medians is printed from criterion's fresh `estimates.json` files.

use vrange_testkit::bench::{criterion_dir, format_ns, fresh_median, size_label};

use criterion::{black_box, BenchmarkId, Criterion, SamplingMode, Throughput};
use std::fmt::Write as _;
use std::ptr::NonNull;
use std::time::{Duration, SystemTime};
use vrange::{Huge, Region};
use vrange_sys::{mem, procfs};

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;

/// Fill byte: every word of every page is non-zero, so the witness is word 0.
const FILL: u8 = 0xA5;
/// The word written back per page by the raw variants (equal to the fill, keeping content).
const WORD: u64 = u64::from_ne_bytes([FILL; 8]);

const METHODS: [&str; 4] = [
    "vrange-region",
    "vrange-any",
    "madv_free",
    "dontneed_refault",
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Small,
    Thp,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Small => "4k",
            Kind::Thp => "thp",
        }
    }

    fn group(self) -> String {
        format!("classic/{}", self.name())
    }
}

/// A plain anonymous mapping (not a Region), unmapped on drop.
struct Mapping {
    base: NonNull<u8>,
    len: usize,
}

impl Mapping {
    fn new(len: usize, kind: Kind) -> Mapping {
        let align = match kind {
            Kind::Small => mem::page_size(),
            Kind::Thp => mem::HUGE_PAGE,
        };
        let base = mem::map_anon(len, align).expect("mmap");
        mem::advise_huge(base.as_ptr(), len, kind == Kind::Thp).expect("MADV_(NO)HUGEPAGE");
        Mapping { base, len }
    }

    fn ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours and nothing refers into it any more.
        unsafe { mem::unmap(self.base, self.len) };
    }
}

/// Sampling plan for one range size.
struct Plan {
    samples: usize,
    measurement: Duration,
    warm_up: Duration,
    flat: bool,
}

fn plan(size: usize, quick: bool) -> Plan {
    let ms = Duration::from_millis;
    match (quick, size) {
        (true, _) => Plan {
            samples: 10,
            measurement: ms(1000),
            warm_up: ms(200),
            flat: size > 2 * MIB,
        },
        (false, s) if s <= 64 * KIB => Plan {
            samples: 100,
            measurement: ms(2000),
            warm_up: ms(500),
            flat: false,
        },
        (false, s) if s <= 2 * MIB => Plan {
            samples: 50,
            measurement: ms(2000),
            warm_up: ms(500),
            flat: false,
        },
        (false, s) if s <= 64 * MIB => Plan {
            samples: 10,
            measurement: ms(2000),
            warm_up: ms(500),
            flat: true,
        },
        (false, _) => Plan {
            samples: 10,
            measurement: ms(3000),
            warm_up: ms(500),
            flat: true,
        },
    }
}

/// Writes `FILL` over the whole range, faulting every page in.
fn fill(ptr: *mut u8, len: usize) {
    // SAFETY: [ptr, ptr + len) is a mapping this bench owns, pinned, with no live references.
    unsafe { ptr.write_bytes(FILL, len) };
}

/// Writes one word per 4 KiB page (the first, with the fill value).
#[inline(always)]
fn touch_pages(ptr: *mut u8, len: usize, page: usize) {
    let mut off = 0;
    while off < len {
        // SAFETY: off < len inside a mapping this bench owns; page-aligned, so word-aligned.
        unsafe { ptr.add(off).cast::<u64>().write_volatile(WORD) };
        off += page;
    }
}

/// Prints a warning unless every page of the range is resident and the page kind is what the
/// group claims (THP: AnonHugePages covers the range and all of the VMA's resident memory; 4k:
/// no AnonHugePages).
fn check(what: &str, ptr: *mut u8, len: usize, kind: Kind) {
    let page = mem::page_size();
    match mem::resident_pages(ptr, len) {
        Ok(n) if n == len / page => {}
        Ok(n) => eprintln!(
            "classic: WARNING: {what}: {n} of {} pages resident",
            len / page
        ),
        Err(e) => eprintln!("classic: WARNING: {what}: mincore failed (errno {e})"),
    }
    let smaps = match procfs::smaps_of(ptr as usize) {
        Ok(Some(s)) => s,
        Ok(None) => {
            eprintln!("classic: WARNING: {what}: no VMA in /proc/self/smaps");
            return;
        }
        Err(e) => {
            eprintln!("classic: WARNING: {what}: reading /proc/self/smaps: {e}");
            return;
        }
    };
    let len_kb = (len / KIB) as u64;
    match kind {
        Kind::Thp if smaps.anon_huge_kb < len_kb || smaps.anon_huge_kb < smaps.rss_kb => {
            eprintln!(
                "classic: WARNING: {what}: THP not fully in use: AnonHugePages {} kB, Rss {} kB, \
                 range {len_kb} kB",
                smaps.anon_huge_kb, smaps.rss_kb
            );
        }
        Kind::Small if smaps.anon_huge_kb > 0 => {
            eprintln!(
                "classic: WARNING: {what}: 4 KiB group has AnonHugePages {} kB",
                smaps.anon_huge_kb
            );
        }
        _ => {}
    }
}

fn bench_size(c: &mut Criterion, kind: Kind, size: usize, quick: bool, list_only: bool) {
    let page = mem::page_size();
    let label = size_label(size);
    let huge = match kind {
        Kind::Small => Huge::Never,
        Kind::Thp => Huge::Always,
    };
    let region = Region::with_huge(size, huge).expect("region");
    assert_eq!(region.len(), size);
    let plain = Mapping::new(size, kind);
    let (rp, pp) = (region.as_ptr(), plain.ptr());
    if !list_only {
        fill(rp, size);
        check(
            &format!("{}/{label} region before", kind.name()),
            rp,
            size,
            kind,
        );
        fill(pp, size);
        check(
            &format!("{}/{label} mapping before", kind.name()),
            pp,
            size,
            kind,
        );
    }

    let p = plan(size, quick);
    let mut g = c.benchmark_group(kind.group());
    g.throughput(Throughput::Bytes(size as u64))
        .sample_size(p.samples)
        .measurement_time(p.measurement)
        .warm_up_time(p.warm_up)
        .sampling_mode(if p.flat {
            SamplingMode::Flat
        } else {
            SamplingMode::Linear
        });

    let mut purged = 0;
    g.bench_function(BenchmarkId::new(METHODS[0], &label), |b| {
        b.iter(|| {
            // SAFETY: nothing refers into the region while it is volatile.
            unsafe { region.mark_volatile(0, size) }.expect("mark");
            let u = region.unmark(0, size).expect("unmark");
            purged += u.purged;
            black_box(u)
        })
    });
    let region_volatile = region.volatile_pages(0, size).unwrap_or(usize::MAX);

    g.bench_function(BenchmarkId::new(METHODS[1], &label), |b| {
        b.iter(|| {
            // SAFETY: the mapping is ours and nothing refers into it while it is volatile.
            unsafe { vrange::mark_volatile(pp, size) }.expect("mark");
            // SAFETY: as above; unmark writes each page's witness word with its own value.
            let u = unsafe { vrange::unmark(pp, size) }.expect("unmark");
            purged += u.purged;
            black_box(u)
        })
    });
    let plain_volatile = vrange::volatile_pages(pp, size).unwrap_or(usize::MAX);
    if !list_only && (region_volatile != 0 || plain_volatile != 0 || purged != 0) {
        eprintln!(
            "classic: WARNING: {}/{label}: {region_volatile} + {plain_volatile} pages left \
             volatile, {purged} purges reported",
            kind.name()
        );
    }

    g.bench_function(BenchmarkId::new(METHODS[2], &label), |b| {
        b.iter(|| {
            // SAFETY: the pages are rewritten below before anyone reads them; their content
            // (the fill) is only relied on by this bench's own checks.
            unsafe { mem::purge_lazy(pp, size) }.expect("MADV_FREE");
            touch_pages(pp, size, page);
        })
    });

    g.bench_function(BenchmarkId::new(METHODS[3], &label), |b| {
        b.iter(|| {
            // SAFETY: nothing refers into the mapping; zeroed content is fine for this bench.
            unsafe { mem::purge_forced(pp, size) }.expect("MADV_DONTNEED");
            touch_pages(pp, size, page);
        })
    });
    g.finish();

    if !list_only {
        check(
            &format!("{}/{label} region after", kind.name()),
            rp,
            size,
            kind,
        );
        check(
            &format!("{}/{label} mapping after", kind.name()),
            pp,
            size,
            kind,
        );
    }
}

/// Prints a markdown table of this run's medians, per-page cost and the two ratios.
fn summary(groups: &[(Kind, Vec<usize>)], since: SystemTime) {
    let Some(dir) = criterion_dir() else { return };
    let page = mem::page_size();
    let mut out = String::new();
    let mut found = false;
    for (kind, sizes) in groups {
        let _ = writeln!(
            out,
            "\n{} pages: median per mark+unmark pair (ns/page)\n",
            match kind {
                Kind::Small => "4 KiB",
                Kind::Thp => "THP",
            }
        );
        let _ = writeln!(
            out,
            "| size | vrange-region | vrange-any | madv_free | dontneed_refault | \
             region / madv_free | region / dontneed_refault |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|");
        for &size in sizes {
            let pages = (size / page) as f64;
            let medians: Vec<Option<f64>> = METHODS
                .iter()
                .map(|m| fresh_median(&dir, &kind.group(), m, &size_label(size), since))
                .collect();
            found |= medians.iter().any(Option::is_some);
            let cell = |m: Option<f64>| match m {
                Some(ns) => format!("{} ({:.1})", format_ns(ns), ns / pages),
                None => "–".to_string(),
            };
            let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
                (Some(a), Some(b)) => format!("{:.2}×", a / b),
                _ => "–".to_string(),
            };
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} |",
                size_label(size),
                cell(medians[0]),
                cell(medians[1]),
                cell(medians[2]),
                cell(medians[3]),
                ratio(medians[0], medians[2]),
                ratio(medians[0], medians[3]),
            );
        }
    }
    if found {
        println!("\nclassic summary (medians from {}):{out}", dir.display());
    }
}

fn main() {
    let since = SystemTime::now();
    let quick = std::env::var("VRANGE_BENCH_QUICK").is_ok_and(|v| v == "1");
    let list_only = std::env::args().any(|a| a == "--list");
    let sizes: Vec<usize> = if quick {
        vec![4 * KIB, 2 * MIB]
    } else {
        vec![4 * KIB, 64 * KIB, 2 * MIB, 64 * MIB, GIB]
    };
    let thp_sizes: Vec<usize> = sizes.iter().copied().filter(|&s| s >= 2 * MIB).collect();
    let groups = [(Kind::Small, sizes), (Kind::Thp, thp_sizes)];

    if !list_only {
        let f = vrange::features();
        eprintln!(
            "classic: page {} B, MADV_FREE {}, THP {:?}, PROCMAP_QUERY {}{}",
            f.page_size,
            f.madv_free,
            f.thp,
            f.procmap_query,
            if quick { ", quick mode" } else { "" }
        );
    }
    let mut c = Criterion::default().configure_from_args();
    for (kind, sizes) in &groups {
        for &size in sizes {
            bench_size(&mut c, *kind, size, quick, list_only);
        }
    }
    c.final_summary();
    if !list_only {
        summary(&groups, since);
    }
}
