//! refill: a zstd-compressed file served as one flat decompressed array, read randomly and in
//! order inside a memory cgroup a quarter of the decompressed size (the decompressor of the
//! 2014 design).
//!
//! The file is synthetic, deterministic log-like text, compressed in independent blocks (the
//! `zstd` crate, level 3) into `refill.zst` under `--out`, with the uncompressed copy beside
//! it. Each method runs in a process of its own (`vrange-bench role refill METHOD ...`) in a
//! fresh child memory cgroup:
//! - `ordinary`: decompress everything into ordinary memory first (the naive answer: it cannot
//!   fit, and is OOM-killed);
//! - `nocache`: decompress the needed block at every access (no memory, all CPU);
//! - `pagecache`: the uncompressed file mmapped (the kernel's own answer: the page cache);
//! - `refill`: a `vrange::RefillRegion` whose fill decompresses the block (on the refill
//!   thread);
//! - `refill-here`: the same, filled on the faulting thread (`RefillRegion::filled_here`).
//!
//! Every process reads the same offsets and reports a checksum of the bytes it read; they must
//! agree. Reported: accesses per second (random and sequential), page faults, the cgroup's
//! peak memory, OOM kills, and for `refill` the time per fill against the published
//! userfaultfd single-fault latency.

use super::plot::{self, Axis, Unit};
use super::report::{self, progress, Csv, Table};
use super::Ctx;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use vrange_testkit::proc::{clean_command, Proc};
use vrange_testkit::role::field;
use vrange_testkit::{cgroup, procfs};

const BLOCK: usize = 256 << 10;
const METHODS: [(&str, &str); 5] = [
    ("ordinary", "decompress all into ordinary memory"),
    ("nocache", "decompress the block at every access"),
    ("pagecache", "uncompressed file, mmapped (page cache)"),
    ("refill", "vrange refill region (decompress on fault)"),
    (
        "refill-here",
        "vrange refill region, filled on the faulting thread",
    ),
];
/// Published single-fault latency of userfaultfd (missing fault resolved by UFFDIO_COPY from a
/// handler thread), for comparison with ours, which includes the decompression.
const PUBLISHED_UFFD_FAULT_US: f64 = 7.8;

/// The synthetic file's bytes at `[offset, offset + buf.len())`: log lines whose numbers vary,
/// compressible as real logs are.
fn content(offset: usize, buf: &mut [u8]) {
    const LINE: usize = 64;
    for (i, b) in buf.iter_mut().enumerate() {
        let pos = offset + i;
        let (line, col) = (pos / LINE, pos % LINE);
        let text = format_line(line);
        *b = text[col];
    }
}

fn format_line(line: usize) -> [u8; 64] {
    let mut out = [b' '; 64];
    let mut w = &mut out[..];
    let _ = write!(
        w,
        "2026-11-25T03:{:02}:{:02} req={:08} status={} bytes={:06}",
        (line / 60) % 60,
        line % 60,
        line,
        [200, 200, 200, 404, 500][line % 5],
        (line * 7919) % 1_000_000
    );
    out[63] = b'\n';
    out
}

/// Writes the compressed blocks and their index (`refill.zst`, `refill.idx`) and the
/// uncompressed copy (`refill.raw`) under `dir`, unless present with this size.
fn prepare(dir: &Path, size: usize) -> Result<(PathBuf, PathBuf, PathBuf), String> {
    let zst = dir.join(format!("refill-{size}.zst"));
    let idx = dir.join(format!("refill-{size}.idx"));
    let raw = dir.join(format!("refill-{size}.raw"));
    if [&zst, &idx, &raw].iter().all(|p| p.exists()) {
        return Ok((zst, idx, raw));
    }
    let err = |e: std::io::Error| e.to_string();
    let mut z = std::fs::File::create(&zst).map_err(err)?;
    let mut r = std::fs::File::create(&raw).map_err(err)?;
    let mut index = String::new();
    let mut buf = vec![0u8; BLOCK];
    let mut at = 0u64;
    for off in (0..size).step_by(BLOCK) {
        let len = BLOCK.min(size - off);
        content(off, &mut buf[..len]);
        r.write_all(&buf[..len]).map_err(err)?;
        let c = zstd::bulk::compress(&buf[..len], 3).map_err(err)?;
        z.write_all(&c).map_err(err)?;
        index.push_str(&format!("{at} {}\n", c.len()));
        at += c.len() as u64;
    }
    std::fs::write(&idx, index).map_err(err)?;
    Ok((zst, idx, raw))
}

/// The compressed blocks: where each lies in the file and how long it is.
struct Blocks {
    file: std::fs::File,
    index: Vec<(u64, usize)>,
}

impl Blocks {
    fn open(zst: &Path, idx: &Path) -> Result<Blocks, String> {
        let file = std::fs::File::open(zst).map_err(|e| e.to_string())?;
        let text = std::fs::read_to_string(idx).map_err(|e| e.to_string())?;
        let index = text
            .lines()
            .filter_map(|l| {
                let (a, b) = l.split_once(' ')?;
                Some((a.parse().ok()?, b.parse().ok()?))
            })
            .collect();
        Ok(Blocks { file, index })
    }

    /// Decompresses block `i` into `out` (its decompressed length).
    fn decompress(&self, i: usize, out: &mut [u8], scratch: &mut Vec<u8>) -> bool {
        let Some(&(at, len)) = self.index.get(i) else {
            return false;
        };
        scratch.resize(len, 0);
        if self.file.read_exact_at(scratch, at).is_err() {
            return false;
        }
        matches!(zstd::bulk::decompress_to_buffer(scratch, out), Ok(n) if n == out.len())
    }
}

/// The offsets every method reads: `random` of them at random, then one byte per 4 KiB in
/// order over the whole array.
fn offsets(size: usize, random: usize) -> (Vec<usize>, Vec<usize>) {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let rand = (0..random)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as usize % size
        })
        .collect();
    (rand, (0..size).step_by(4096).collect())
}

/// Pages touched by the fault-latency roles.
const FAULT_PAGES: usize = 4096;

static SIGBUS_PAGE: [u8; 4096] = [7; 4096];

extern "C" fn fill_from_handler(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    let page = vrange::page_size();
    // SAFETY: a valid siginfo for an SA_SIGINFO handler.
    let at = unsafe { (*info).si_addr() } as usize & !(page - 1);
    // SAFETY: SIGBUS_PAGE is a page; `at` is a purged page of this role's SIGBUS region.
    let _ = unsafe { vrange::fill(at as *mut u8, SIGBUS_PAGE.as_ptr(), page) };
}

/// `fault-refill` / `fault-here` / `fault-sigbus`: the time of one fault on a missing page, fill
/// included
/// (a page of constant bytes: the mechanism, not a decompressor). Prints `done us_per_fault=`.
fn fault_role(kind: &str) -> i32 {
    let page = vrange::page_size();
    let len = FAULT_PAGES * page;
    let t = match kind {
        "fault-refill" | "fault-here" => {
            let fill = |_: usize, buf: &mut [u8]| {
                buf.fill(7);
                true
            };
            let r = if kind == "fault-here" {
                vrange::RefillRegion::filled_here(len, page, fill)
            } else {
                vrange::RefillRegion::new(len, page, fill)
            };
            let r = match r {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("fault role: {e}");
                    return 1;
                }
            };
            let t0 = Instant::now();
            for i in 0..FAULT_PAGES {
                // SAFETY: inside the region; the read waits for the fill.
                unsafe { r.as_ptr().add(i * page).read_volatile() };
            }
            t0.elapsed()
        }
        _ => {
            let opts = vrange::Options {
                policy: vrange::Policy::Managed,
                sigbus: true,
                huge: vrange::Huge::Never,
                ..vrange::Options::default()
            };
            let r = match vrange::VolatileRegion::new(len, opts) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("fault role: {e}");
                    return 1;
                }
            };
            // The handler fills this process's own SIGBUS region, async-signal-safe.
            vrange_testkit::signal::on_sigbus(fill_from_handler);
            // SAFETY: nothing refers into the region.
            if unsafe { r.mark() }.is_err() || vrange::purge(usize::MAX) < len {
                eprintln!("fault role: could not purge the region");
                return 1;
            }
            let t0 = Instant::now();
            for i in 0..FAULT_PAGES {
                // SAFETY: inside the region; the handler places the page.
                unsafe { r.as_ptr().add(i * page).read_volatile() };
            }
            t0.elapsed()
        }
    };
    println!(
        "done us_per_fault={:.3}",
        t.as_secs_f64() * 1e6 / FAULT_PAGES as f64
    );
    0
}

/// The role: `METHOD SIZE RANDOM ZST IDX RAW`, or `fault-refill` / `fault-here` /
/// `fault-sigbus`; prints
/// `done ...` with the times, faults and checksum.
pub fn role(args: &[String]) -> i32 {
    if let Some(kind) = args.first().filter(|a| a.starts_with("fault-")) {
        return fault_role(kind);
    }
    let [method, size, random, zst, idx, raw] = args else {
        eprintln!("usage: vrange-bench role refill METHOD SIZE RANDOM ZST IDX RAW");
        return 2;
    };
    let (Ok(size), Ok(random)) = (size.parse::<usize>(), random.parse::<usize>()) else {
        eprintln!("refill role: bad numbers");
        return 2;
    };
    let blocks = match Blocks::open(Path::new(zst), Path::new(idx)) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("refill role: {e}");
            return 1;
        }
    };
    // Whoever read the files first (the writer) was charged for their page cache: drop it, so
    // that this process's reads are charged to its own cgroup.
    for path in [zst, raw] {
        if let Ok(f) = std::fs::File::open(path) {
            // SAFETY: advice on an open descriptor; no memory is touched.
            unsafe {
                libc::posix_fadvise(
                    std::os::fd::AsRawFd::as_raw_fd(&f),
                    0,
                    0,
                    libc::POSIX_FADV_DONTNEED,
                )
            };
        }
    }
    let (rand, seq) = offsets(size, random);
    // Reads through `read(offset)`; the checksum makes every method read the same bytes.
    let run = |read: &mut dyn FnMut(usize) -> u8| {
        let t0 = Instant::now();
        let mut sum = 0u64;
        for &o in &rand {
            sum = sum.wrapping_mul(31).wrapping_add(u64::from(read(o)));
        }
        let t_rand = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        for &o in &seq {
            sum = sum.wrapping_mul(31).wrapping_add(u64::from(read(o)));
        }
        (t_rand, t1.elapsed().as_secs_f64(), sum)
    };
    let faults0 = procfs::page_faults();
    let stats0 = vrange::stats();
    let (t_rand, t_seq, sum) = match method.as_str() {
        "ordinary" => {
            let mut all = vec![0u8; size];
            let mut scratch = Vec::new();
            for (i, chunk) in all.chunks_mut(BLOCK).enumerate() {
                if !blocks.decompress(i, chunk, &mut scratch) {
                    eprintln!("refill role: block {i} does not decompress");
                    return 1;
                }
            }
            run(&mut |o| all[o])
        }
        "nocache" => {
            let (mut buf, mut scratch) = (vec![0u8; BLOCK], Vec::new());
            run(&mut |o| {
                let i = o / BLOCK;
                let len = BLOCK.min(size - i * BLOCK);
                blocks.decompress(i, &mut buf[..len], &mut scratch);
                buf[o % BLOCK]
            })
        }
        "pagecache" => {
            let file = match std::fs::File::open(raw) {
                Ok(f) => f,
                Err(e) => {
                    eprintln!("refill role: {raw}: {e}");
                    return 1;
                }
            };
            let map = match vrange_sys::mem::map_file_readonly(&file, size) {
                Ok(m) => m,
                Err(e) => {
                    eprintln!("refill role: mmap: {e}");
                    return 1;
                }
            };
            // SAFETY: the mapping is `size` bytes of a file nobody writes, alive in this scope.
            let bytes = unsafe { std::slice::from_raw_parts(map.as_ptr(), size) };
            let r = run(&mut |o| bytes[o]);
            // SAFETY: mapped above; the slice is not used any more.
            unsafe { vrange_sys::mem::unmap(map, size) };
            r
        }
        "refill" | "refill-here" => {
            let region = if method == "refill" {
                let mut scratch = Vec::new();
                vrange::RefillRegion::new(size, BLOCK, move |off, buf| {
                    blocks.decompress(off / BLOCK, buf, &mut scratch)
                })
            } else {
                thread_local! {
                    static SCRATCH: std::cell::RefCell<Vec<u8>> = const {
                        std::cell::RefCell::new(Vec::new())
                    };
                }
                // The fill runs in the reading thread's SIGBUS handler, which holds nothing
                // the decompression takes (the read is a plain load).
                vrange::RefillRegion::filled_here(size, BLOCK, move |off, buf| {
                    SCRATCH.with(|s| blocks.decompress(off / BLOCK, buf, &mut s.borrow_mut()))
                })
            };
            let region = match region {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("refill role: {method}: {e}");
                    return 1;
                }
            };
            let base = region.as_ptr();
            // SAFETY: inside the region; a read of a missing block waits for its fill (or, in
            // `refill-here`, fills it on this thread).
            run(&mut |o| unsafe { base.add(o).read_volatile() })
        }
        other => {
            eprintln!("refill role: unknown method {other}");
            return 2;
        }
    };
    let faults = procfs::page_faults();
    let stats = vrange::stats();
    println!(
        "done rand_secs={t_rand:.4} seq_secs={t_seq:.4} sum={sum} minflt={} majflt={} fills={} \
         recycled={} moved={}",
        faults.0 - faults0.0,
        faults.1 - faults0.1,
        stats.refill_fills - stats0.refill_fills,
        stats.refill_recycled_bytes - stats0.refill_recycled_bytes,
        stats.refill_moved_bytes - stats0.refill_moved_bytes
    );
    0
}

struct Outcome {
    line: Option<String>,
    exit: String,
    oom_kills: Option<u64>,
    peak: Option<u64>,
}

fn run_method(ctx: &Ctx, method: &str, args: &[String], limit: u64) -> Result<Outcome, String> {
    let cgroup = cgroup::try_child("vrange-bench-refill", limit)?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = clean_command(&exe);
    cmd.args(["role", "refill", method])
        .args(args)
        .env("VRANGE_STATS_DIR", "off");
    cgroup::join(&mut cmd, cgroup.cgroup())?;
    let mut p = Proc::try_spawn(cmd)?;
    let deadline = Duration::from_secs(if ctx.quick() { 120 } else { 900 });
    let line = p.line("done", Instant::now() + deadline);
    let exit = p.wait(Duration::from_secs(30));
    let cg = cgroup.cgroup();
    Ok(Outcome {
        line,
        exit: exit.to_string(),
        oom_kills: cg.oom_kills().ok(),
        peak: cgroup::peak(cg),
    })
}

pub fn run(ctx: &Ctx) -> Result<(), String> {
    let size: usize = if ctx.quick() { 64 << 20 } else { 512 << 20 };
    let random: usize = if ctx.quick() { 2_000 } else { 20_000 };
    let limit = (size / 4) as u64;
    ctx.say(format!(
        "refill: a {} file of log lines compressed with zstd (level 3) in independent {} \
         blocks, read at {random} random offsets and then one byte per 4 KiB in order, each \
         method in a process of its own in a memory cgroup limited to {} (a quarter). Every \
         method must read the same bytes (checksum). Published userfaultfd single-fault \
         latency: about {PUBLISHED_UFFD_FAULT_US} µs.",
        report::size(size),
        report::size(BLOCK),
        report::size(limit as usize),
    ));
    progress("refill: writing the compressed file");
    let (zst, idx, raw) = prepare(&ctx.out, size)?;
    let compressed = std::fs::metadata(&zst).map(|m| m.len()).unwrap_or(0);
    ctx.say(format!(
        "compressed: {} ({:.1}x)",
        report::size(compressed as usize),
        size as f64 / compressed.max(1) as f64
    ));
    let args: Vec<String> = [
        size.to_string(),
        random.to_string(),
        zst.display().to_string(),
        idx.display().to_string(),
        raw.display().to_string(),
    ]
    .into();
    let mut table = Table::new(&[
        "method",
        "random reads/s",
        "sequential MB/s",
        "minor faults",
        "major faults",
        "fills",
        "per fill",
        "recycled / moved",
        "peak memory",
        "OOM kills",
    ]);
    let mut csv = Csv::new(&[
        "method",
        "size_bytes",
        "limit_bytes",
        "random_reads_per_s",
        "sequential_mb_per_s",
        "minflt",
        "majflt",
        "fills",
        "us_per_fill",
        "recycled_bytes",
        "moved_bytes",
        "peak_bytes",
        "oom_kills",
        "status",
    ]);
    let mut bars = Vec::new();
    let mut sums = Vec::new();
    for (method, what) in METHODS {
        progress(format!("refill: {method}"));
        let o = match run_method(ctx, method, &args, limit) {
            Ok(o) => o,
            Err(why) => {
                ctx.skipped(&format!("refill {method}"), &why);
                table.row(vec![what.into(), format!("skipped: {why}")]);
                continue;
            }
        };
        let kills = o.oom_kills.map_or("?".into(), |k| k.to_string());
        let peak = o.peak.map_or("?".into(), |p| report::size(p as usize));
        let Some(line) = o.line else {
            if method != "ordinary" {
                return Err(format!(
                    "{method}: did not finish ({}; OOM kills {kills})",
                    o.exit
                ));
            }
            table.row(vec![
                what.into(),
                format!("did not finish: {} (expected: it cannot fit)", o.exit),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                peak,
                kills.clone(),
            ]);
            csv.note(&[method, &size.to_string(), &limit.to_string()], &o.exit);
            bars.push((what.to_string(), None));
            continue;
        };
        let get = |k| field::<f64>(&line, k).ok_or_else(|| format!("{method}: no {k}"));
        let (rs, ss) = (get("rand_secs")?, get("seq_secs")?);
        let (minflt, majflt, fills) = (get("minflt")?, get("majflt")?, get("fills")?);
        let (recycled, moved) = (get("recycled")?, get("moved")?);
        sums.push((method, field::<u64>(&line, "sum").unwrap_or(0)));
        let rate = random as f64 / rs;
        let mbs = (size / 4096) as f64 * 4096.0 / 1e6 / ss;
        let per_fill = (fills > 0.0).then(|| (rs + ss) / fills * 1e6);
        table.row(vec![
            what.into(),
            report::rate(rate),
            format!("{mbs:.0}"),
            format!("{minflt:.0}"),
            format!("{majflt:.0}"),
            format!("{fills:.0}"),
            per_fill.map_or("–".into(), |u| format!("{u:.1} µs")),
            if fills > 0.0 {
                let mib = |b: f64| b / f64::from(1u32 << 20);
                format!("{:.0} / {:.0} MiB", mib(recycled), mib(moved))
            } else {
                "–".into()
            },
            peak,
            kills,
        ]);
        csv.row([
            method.to_string(),
            size.to_string(),
            limit.to_string(),
            format!("{rate:.0}"),
            format!("{mbs:.1}"),
            format!("{minflt:.0}"),
            format!("{majflt:.0}"),
            format!("{fills:.0}"),
            per_fill.map_or(String::new(), |u| format!("{u:.2}")),
            format!("{recycled:.0}"),
            format!("{moved:.0}"),
            o.peak.map_or(String::new(), |p| p.to_string()),
            o.oom_kills.map_or(String::new(), |k| k.to_string()),
            "ok".into(),
        ]);
        bars.push((what.to_string(), Some(rate)));
    }
    ctx.table(&table);
    let mut faults = Table::new(&[
        "one fault on a missing page, fill included",
        "per fault",
        "published userfaultfd",
    ]);
    for (kind, what) in [
        (
            "fault-refill",
            "refill region, 4 KiB blocks of constant bytes",
        ),
        (
            "fault-here",
            "refill region filled on the faulting thread, 4 KiB blocks",
        ),
        (
            "fault-sigbus",
            "SIGBUS mode: handler + vrange_fill of a page",
        ),
    ] {
        progress(format!("refill: {kind}"));
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut cmd = clean_command(&exe);
        cmd.args(["role", "refill", kind])
            .env("VRANGE_STATS_DIR", "off");
        let mut p = Proc::try_spawn(cmd)?;
        let line = p.line("done", Instant::now() + Duration::from_secs(120));
        let exit = p.wait(Duration::from_secs(30));
        let us = line
            .as_deref()
            .and_then(|l| field::<f64>(l, "us_per_fault"))
            .ok_or_else(|| format!("{kind}: {exit}: {}", p.stderr().trim()))?;
        faults.row(vec![
            what.into(),
            format!("{us:.2} µs"),
            format!("{PUBLISHED_UFFD_FAULT_US} µs"),
        ]);
        csv.note(&[kind, "", "", ""], &format!("us_per_fault={us:.3}"));
    }
    ctx.table(&faults);
    if let Some((_, first)) = sums.first() {
        if let Some((m, _)) = sums.iter().find(|(_, s)| s != first) {
            return Err(format!("{m} read other bytes than {}", sums[0].0));
        }
    }
    csv.write(&ctx.out, "refill.csv")?;
    let categories: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    let svg = plot::bars(
        &ctx.figure(format!(
            "Random reads of a {} zstd file under a {} memory limit",
            report::size(size),
            report::size(limit as usize)
        )),
        &categories,
        &Axis::log("random reads per second", Unit::Plain),
        &[(
            "reads/s".into(),
            bars.iter().map(|b| b.1).collect::<Vec<_>>(),
        )],
    );
    report::write_file(&ctx.out, "refill.svg", &svg)?;
    Ok(())
}
