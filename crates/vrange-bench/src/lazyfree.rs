//! lazyfree: the time MADV_FREE takes to mark 1 GiB lazily free, by the size of the folios
//! backing it: 4 KiB pages, each multi-size THP (mTHP) size the kernel offers, and 2 MiB THP.
//! The published numbers are Lance Yang's (mm/madvise: lazyfreeing mTHP without splitting,
//! 2024), before and after that series; this kernel has it or not, and the table says which
//! shape it shows.
//!
//! How: map 1 GiB (2 MiB-aligned), advise it (MADV_NOHUGEPAGE for 4 KiB, MADV_HUGEPAGE
//! otherwise), write one byte per 4 KiB page to fault it in, then time one
//! `madvise(MADV_FREE)` over the whole range; unmap, repeat, report the median. Which folio
//! size the kernel really used is checked, not assumed: the size's `stats/anon_fault_alloc`
//! counter in sysfs says how many folios of it were allocated while the range was faulted in
//! ("coverage"; other processes faulting at the same time can add to it).
//!
//! Choosing a size needs root: the suite sets `hugepages-<size>kB/enabled` to `madvise` and
//! every larger size to `never` (the kernel tries the largest allowed size first). Every
//! setting it changes is saved first and written back when the suite ends, also on error or
//! panic (a guard's `Drop`); SIGINT, SIGTERM and SIGHUP are blocked meanwhile, so an
//! interrupt takes effect after the restore. While it runs, other processes' huge-page advice
//! follows the changed settings. Without root or mTHP it measures 4 KiB against 2 MiB THP with
//! the settings as they are.

use super::plot::{self, Axis, Series, Unit};
use super::report::{self, progress, Csv, Table};
use super::Ctx;
use std::path::{Path, PathBuf};
use std::time::Instant;
use vrange_sys::mem;

const THP: &str = "/sys/kernel/mm/transparent_hugepage";
const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;

/// Lance Yang's table, 1 GiB on an Intel i5: folio KiB, seconds before and after the series.
const PUBLISHED: [(usize, f64, f64); 9] = [
    (4, 0.590251, 0.590259),
    (16, 2.990447, 0.185655),
    (32, 2.547831, 0.104870),
    (64, 2.457796, 0.052812),
    (128, 2.281034, 0.032777),
    (256, 2.230387, 0.017496),
    (512, 2.189106, 0.010781),
    (1024, 2.183949, 0.007753),
    (2048, 0.002799, 0.002804),
];

/// Sysfs settings changed by the suite, written back on drop (error and panic included).
struct SettingsGuard {
    saved: Vec<(PathBuf, String)>,
    blocked: libc::sigset_t,
}

impl SettingsGuard {
    fn new() -> SettingsGuard {
        // SAFETY: sigset_t is plain data; sigemptyset/sigaddset initialise it, and
        // pthread_sigmask only changes this thread's mask (threads started later inherit it).
        let blocked = unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::sigaddset(&mut set, sig);
            }
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            set
        };
        SettingsGuard {
            saved: Vec::new(),
            blocked,
        }
    }

    /// Writes `value` to `path`, saving what it held the first time.
    fn set(&mut self, path: &Path, value: &str) -> Result<(), String> {
        let current = read_setting(path)?;
        if current == value {
            return Ok(());
        }
        if !self.saved.iter().any(|(p, _)| p == path) {
            self.saved.push((path.to_path_buf(), current));
        }
        std::fs::write(path, value).map_err(|e| format!("write {value} to {}: {e}", path.display()))
    }
}

impl Drop for SettingsGuard {
    fn drop(&mut self) {
        // Larger sizes were disabled after smaller ones were enabled: undo in reverse order.
        for (path, value) in self.saved.iter().rev() {
            if let Err(e) = std::fs::write(path, value) {
                eprintln!(
                    "vrange-bench lazyfree: could not restore {} to {value}: {e}",
                    path.display()
                );
            }
        }
        // SAFETY: unblocks exactly the signals `new` blocked, for this thread; a pending one is
        // delivered now, with every setting already restored.
        unsafe {
            libc::pthread_sigmask(libc::SIG_UNBLOCK, &self.blocked, std::ptr::null_mut());
        }
    }
}

/// The selected word of a sysfs choice file (`always [madvise] never` → `madvise`).
fn read_setting(path: &Path) -> Result<String, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("read {}: {e}", path.display()))?;
    Ok(super::machine::selected(text.trim()))
}

/// The mTHP sizes (KiB) with a sysfs directory, ascending.
fn mthp_sizes() -> Vec<usize> {
    let mut v: Vec<usize> = std::fs::read_dir(THP)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().to_string();
            name.strip_prefix("hugepages-")?
                .strip_suffix("kB")?
                .parse()
                .ok()
        })
        .collect();
    v.sort_unstable();
    v
}

fn size_dir(kib: usize) -> PathBuf {
    Path::new(THP).join(format!("hugepages-{kib}kB"))
}

fn fault_allocs(kib: usize) -> Option<u64> {
    std::fs::read_to_string(size_dir(kib).join("stats/anon_fault_alloc"))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Makes `kib` the largest folio size the kernel may use for MADV_HUGEPAGE memory.
fn select(guard: &mut SettingsGuard, kib: usize, all: &[usize]) -> Result<(), String> {
    let top = read_setting(&Path::new(THP).join("enabled"))?;
    let dir = size_dir(kib);
    let own = read_setting(&dir.join("enabled"))?;
    let usable = match own.as_str() {
        "always" | "madvise" => true,
        "inherit" => top != "never",
        _ => false,
    };
    if !usable {
        guard.set(&dir.join("enabled"), "madvise")?;
    }
    for &larger in all.iter().filter(|&&s| s > kib) {
        guard.set(&size_dir(larger).join("enabled"), "never")?;
    }
    Ok(())
}

struct Sample {
    seconds: f64,
    /// Share of the range faulted in as folios of the size asked for (None: not measurable).
    coverage: Option<f64>,
}

/// Maps `len`, faults it in as `kib` folios (4: small pages), times MADV_FREE over it.
fn once(len: usize, kib: usize) -> Result<Sample, String> {
    let base = mem::map_anon(len, 2 * MIB).map_err(|e| format!("mmap {len}: errno {e}"))?;
    let ptr = base.as_ptr();
    let result = (|| {
        mem::advise_huge(ptr, len, kib > 4).map_err(|e| format!("MADV_(NO)HUGEPAGE: errno {e}"))?;
        let before = fault_allocs(kib);
        for off in (0..len).step_by(mem::page_size()) {
            // SAFETY: inside the mapping made above, which nothing else knows of.
            unsafe { ptr.add(off).write_volatile(1) };
        }
        let coverage = match (before, fault_allocs(kib)) {
            (Some(a), Some(b)) => Some(((b - a) as f64 * (kib * KIB) as f64 / len as f64).min(1.0)),
            // 4 KiB pages have no counter; MADV_NOHUGEPAGE guarantees them.
            _ => None,
        };
        let t = Instant::now();
        // SAFETY: the mapping is ours; its content is never read again.
        unsafe { mem::purge_lazy(ptr, len) }.map_err(|e| format!("MADV_FREE: errno {e}"))?;
        let seconds = t.elapsed().as_secs_f64();
        Ok(Sample { seconds, coverage })
    })();
    // SAFETY: the mapping made above, with no reference into it left.
    unsafe { mem::unmap(base, len) };
    result
}

pub fn run(ctx: &Ctx) -> Result<(), String> {
    let len = if ctx.quick() { 64 * MIB } else { 1 << 30 };
    let reps = if ctx.quick() { 1 } else { 5 };
    let all = mthp_sizes();
    let root = vrange_testkit::is_root();
    let thp_top = read_setting(&Path::new(THP).join("enabled")).unwrap_or_else(|_| "never".into());
    let sizes: Vec<usize> = if root && !all.is_empty() {
        // Anonymous mTHP starts at order 2 (16 KiB); smaller directories are for files.
        std::iter::once(4)
            .chain(all.iter().copied().filter(|&k| k >= 16))
            .collect()
    } else {
        let why = if root {
            "this kernel has no multi-size THP (no hugepages-*kB directories)"
        } else {
            "choosing a folio size needs root"
        };
        ctx.skipped(
            "mTHP sizes",
            &format!(
                "{why}; measuring 4 KiB pages against 2 MiB THP with the settings as they are"
            ),
        );
        if thp_top == "never" {
            vec![4]
        } else {
            vec![4, 2048]
        }
    };
    ctx.say(format!(
        "lazyfree: madvise(MADV_FREE) over {} faulted in with folios of one size, median of \
         {reps}; published: Lance Yang, \"mm/madvise: enhance lazyfreeing with mTHP in \
         madvise_free\" v7 (2024), 1 GiB on an Intel i5, before and after the series.",
        report::size(len)
    ));
    let mut results: Vec<(usize, f64, Option<f64>, Vec<f64>)> = Vec::new();
    {
        let mut guard = SettingsGuard::new();
        for &kib in &sizes {
            if kib > 4 && root && !all.is_empty() {
                select(&mut guard, kib, &all)?;
            }
            progress(format!("lazyfree: {} folios", report::size(kib * KIB)));
            let mut times = Vec::new();
            let mut coverage = Vec::new();
            for _ in 0..reps {
                let s = once(len, kib)?;
                times.push(s.seconds);
                coverage.extend(s.coverage);
            }
            let median = report::median(&mut times.clone()).unwrap_or(f64::NAN);
            results.push((kib, median, report::median(&mut coverage), times));
        }
        // The guard restores every setting here.
    }
    let per_gib = (1u64 << 30) as f64 / len as f64;
    let mut table = Table::new(&[
        "folio size",
        "range in folios of that size",
        &format!("MADV_FREE {} (median)", report::size(len)),
        "per GiB",
        "published before (1 GiB)",
        "published after (1 GiB)",
        "ours per GiB / published after",
    ]);
    let mut csv = Csv::new(&[
        "folio_kib",
        "range_bytes",
        "coverage",
        "median_seconds",
        "seconds_per_gib",
        "published_before_s",
        "published_after_s",
        "runs_seconds",
    ]);
    let mut ours = Series::new("ours (per GiB)", vec![]);
    for &(kib, secs, coverage, ref times) in &results {
        let published = PUBLISHED.iter().find(|p| p.0 == kib);
        let gib = secs * per_gib;
        table.row(vec![
            report::size(kib * KIB),
            match coverage {
                Some(c) => format!("{:.0} %", c * 100.0),
                None if kib == 4 => "all (MADV_NOHUGEPAGE)".into(),
                None => "? (no sysfs counter)".into(),
            },
            report::ns(secs * 1e9),
            report::ns(gib * 1e9),
            published.map_or("–".into(), |p| format!("{} s", p.1)),
            published.map_or("–".into(), |p| format!("{} s", p.2)),
            report::times(published.map(|p| gib / p.2)),
        ]);
        csv.row([
            kib.to_string(),
            len.to_string(),
            report::opt(coverage, 3),
            format!("{secs:.6}"),
            format!("{gib:.6}"),
            published.map_or(String::new(), |p| p.1.to_string()),
            published.map_or(String::new(), |p| p.2.to_string()),
            times
                .iter()
                .map(|t| format!("{t:.6}"))
                .collect::<Vec<_>>()
                .join(" "),
        ]);
        ours.points.push(((kib * KIB) as f64, gib * 1e9));
    }
    ctx.table(&table);
    if results.iter().any(|r| r.2.is_some_and(|c| c < 0.9)) {
        ctx.say(
            "lazyfree: a size below 90 % coverage was partly served by smaller folios \
             (fragmented memory or a failed allocation); its time mixes sizes.",
        );
    }
    csv.write(&ctx.out, "lazyfree.csv")?;
    let published = |name: &str, secs: fn(&(usize, f64, f64)) -> f64| {
        let points = PUBLISHED
            .iter()
            .map(|p| ((p.0 * KIB) as f64, secs(p) * 1e9))
            .collect();
        Series::new(name, points)
    };
    let svg = plot::lines(
        &ctx.figure("MADV_FREE of 1 GiB by folio size"),
        &Axis::log("folio size (bytes)", Unit::Bytes),
        &Axis::log("MADV_FREE time per GiB", Unit::Nanoseconds),
        &[
            ours,
            published("published before", |p| p.1),
            published("published after", |p| p.2),
        ],
    );
    report::write_file(&ctx.out, "lazyfree.svg", &svg)?;
    Ok(())
}
