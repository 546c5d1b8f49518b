//! sqlite: SQLite on `vrange_sqlite_pcache()` against SQLite's own page cache, in a memory
//! cgroup beside a neighbour whose memory ramps.
//!
//! A database of about 60 % of the cgroup's limit (`c/sqlite_service.c create`: rows of 100 to
//! 1,299 bytes of text, an index on a second key, WAL journal) is made outside the cgroup.
//! Then, in one fresh child memory cgroup per peer, a service (`sqlite_service serve`: one
//! connection, a mix in the manner of SQLite's speedtest1: 75 % indexed lookups of one row,
//! 20 % range scans of 20 rows, 5 % transactions updating 5 rows, every row read checked)
//! works from the epoch to the end, beside the neighbour of the cache and coordinate suites
//! (`role neighbour`: nothing during the warm-up, then 0 → 60 % of the limit → 0, a raised
//! cosine, then nothing), which the OOM killer spares (the service makes itself its first
//! choice). A killed service is started again after [`RESTART`] with a cold cache, as a
//! supervisor would. The service first drops the file's pages from the kernel's page cache, so
//! what it reads is charged to its own cgroup.
//!
//! Peers: SQLite's own page cache at its default `cache_size` (2 MB), SQLite's own page cache
//! with `cache_size` for all memory (the limit less an eighth for the process), and
//! `vrange_sqlite_pcache()` (loaded from `libvrange.so` beside this executable) with the same
//! `cache_size`, vrange at default settings. Reported per peer: operations per second overall,
//! while memory is free (the neighbour holds nothing) and while the neighbour is above half its
//! peak, the worst second, seconds without service, OOM kills, reads of the file (system calls)
//! and from the disk, peak cgroup memory, wrong rows (must be 0); per second in CSV and a plot.
//! The targets: no OOM kill for vrange, at least the default cache's throughput in
//! every second, and close to the big cache's while memory is free.

use super::neighbour::{Neighbour, Ramp};
use super::plot::Series;
use super::report::{self, mib, progress, Csv, Table};
use super::service::{plot_over_time, supervise, wrong_row, Samples, MIB, RESTART, SEC};
use super::workload::SQLITE_SERVICE;
use super::Ctx;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use vrange_sys::clock::now_ns;
use vrange_testkit::cgroup;
use vrange_testkit::proc::{clean_command, Proc};
use vrange_testkit::role::Reply;

/// The neighbour's peak and the database's size, in percent of the limit.
const NEIGHBOUR_PERCENT: u64 = 60;
const DATABASE_PERCENT: u64 = 60;
/// Bytes of database per row (`sqlite_service create`: 700 bytes of text on average, the
/// index and the b-trees' slack).
const ROW_BYTES: u64 = 845;

/// One second of the service: operations, reads of the file (system calls), KiB read from the
/// disk, wrong rows, and its resident KiB at the second's end.
#[derive(Default, Clone, Copy)]
struct Second {
    ops: u64,
    reads: u64,
    disk_kib: u64,
    wrong: u64,
    rss_kib: u64,
}

impl Second {
    fn parse(line: &str) -> Option<(usize, Second)> {
        let r = Reply::parse(line);
        if r.tag != "sec" {
            return None;
        }
        let get = |k| r.get::<u64>(k).unwrap_or(0);
        Some((
            r.get("n")?,
            Second {
                ops: get("ops"),
                reads: get("reads"),
                disk_kib: get("disk_kib"),
                wrong: get("wrong"),
                rss_kib: get("rss_kib"),
            },
        ))
    }

    fn add(&mut self, o: &Second) {
        self.ops += o.ops;
        self.reads += o.reads;
        self.disk_kib += o.disk_kib;
        self.wrong += o.wrong;
        self.rss_kib = self.rss_kib.max(o.rss_kib);
    }
}

/// A peer: the service's CACHE argument and its names.
struct Peer {
    cache: String,
    label: String,
    short: &'static str,
}

struct Run {
    seconds: Vec<Second>,
    samples: Samples,
    /// Seconds after the epoch at which the service was found killed.
    kills: Vec<f64>,
    neighbour_kills: Vec<f64>,
    oom_kills: Option<u64>,
    peak: Option<u64>,
}

impl Run {
    fn total(&self, keep: impl Fn(usize) -> bool) -> (Second, usize) {
        let mut t = Second::default();
        let mut n = 0;
        for (_, s) in self.seconds.iter().enumerate().filter(|(i, _)| keep(*i)) {
            t.add(s);
            n += 1;
        }
        (t, n)
    }

    /// Operations per second over the seconds `keep` accepts.
    fn rate(&self, keep: impl Fn(usize) -> bool) -> f64 {
        let (t, n) = self.total(keep);
        t.ops as f64 / n.max(1) as f64
    }
}

/// The scenario: a 256 MiB cgroup, 10 s of warm-up, a 40 s ramp and a 10 s tail; `quick`:
/// 96 MiB, 3 s, 8 s and 2 s.
fn scenario(quick: bool) -> (u64, Ramp) {
    let limit = if quick { 96 * MIB } else { 256 * MIB };
    let ramp = Ramp {
        peak: limit * NEIGHBOUR_PERCENT / 100,
        warmup: Duration::from_secs(if quick { 3 } else { 10 }),
        period: Duration::from_secs(if quick { 8 } else { 40 }),
        tail: Duration::from_secs(if quick { 2 } else { 10 }),
    };
    (limit, ramp)
}

/// libvrange.so beside this executable (`cargo build --release -p vrange-ffi` puts it there).
fn libvrange() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let so = exe.with_file_name("libvrange.so");
    if so.exists() {
        Ok(so)
    } else {
        Err(format!(
            "libvrange.so not found beside {}; build it with `cargo build --release -p \
             vrange-ffi`",
            exe.display()
        ))
    }
}

fn one(
    service: &Path,
    db: &Path,
    lib: &Path,
    peer: &Peer,
    limit: u64,
    ramp: &Ramp,
) -> Result<Run, String> {
    let cg = cgroup::try_child("vrange-bench-sqlite", limit)?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let neighbour_spawn = |args: &[String]| -> Result<Proc, String> {
        let mut cmd = clean_command(&exe);
        cmd.arg("role").args(args).env("VRANGE_STATS_DIR", "off");
        cgroup::join(&mut cmd, cg.cgroup())?;
        Proc::try_spawn(cmd)
    };
    let epoch = now_ns() + SEC;
    let end = epoch + ramp.total().as_nanos() as u64;
    let service_spawn = || -> Result<Proc, String> {
        let mut cmd = clean_command(service);
        cmd.arg("serve")
            .arg(db)
            .arg(&peer.cache)
            .arg(epoch.to_string())
            .arg(end.to_string())
            .arg(lib)
            .env("VRANGE_STATS_DIR", "off");
        cgroup::join(&mut cmd, cg.cgroup())?;
        Proc::try_spawn(cmd)
    };
    let neighbour = Neighbour::start(neighbour_spawn, ramp.role_args(epoch, end))?;
    let mut seconds = vec![Second::default(); ramp.seconds()];
    let seen = supervise(
        &peer.label,
        cg.cgroup(),
        (epoch, end),
        neighbour,
        neighbour_spawn,
        service_spawn,
        |line| {
            if let Some((n, s)) = Second::parse(line) {
                if let Some(slot) = seconds.get_mut(n) {
                    slot.add(&s);
                }
            }
        },
    )?;
    Ok(Run {
        seconds,
        samples: seen.samples,
        kills: seen.kills,
        neighbour_kills: seen.neighbour_kills,
        oom_kills: cg.cgroup().oom_kills().ok(),
        peak: cgroup::peak(cg.cgroup()),
    })
}

/// `sqlite_service create DB ROWS`: a database of `rows` rows.
fn create(service: &Path, db: &Path, rows: u64) -> Result<std::process::Output, String> {
    Command::new(service)
        .arg("create")
        .arg(db)
        .arg(rows.to_string())
        .output()
        .map_err(|e| format!("{}: {e}", service.display()))
}

/// The error of a `create` that failed.
fn create_failed(made: &std::process::Output) -> String {
    format!(
        "sqlite_service create: {}",
        String::from_utf8_lossy(&made.stderr).trim()
    )
}

/// The stress suite's SQLite case (the reproducer): a 64 MiB cgroup, the service on
/// `vrange_sqlite_pcache()` with a cache_size for all of it, and a neighbour that takes 40 MiB
/// within half a second of the cache being warm (4 s), then lets it go.
pub(crate) const STRESS_LIMIT: u64 = 64 * MIB;
const STRESS_NEIGHBOUR: u64 = 40 * MIB;

/// One stress trial's outcome.
pub(crate) struct StressRun {
    pub oom_kills: Option<u64>,
    pub service_kills: usize,
    pub neighbour_kills: usize,
    pub ops: u64,
    pub wrong: u64,
}

/// The database of the stress case, made once in `dir` (kept between trials; made under
/// another name and renamed once whole, so that a run cut short leaves none to reuse).
/// `Ok(Err(why))`: this machine's SQLite cannot run the service (the case is skipped).
pub(crate) fn stress_database(dir: &Path) -> Result<Result<(PathBuf, PathBuf), String>, String> {
    let service = SQLITE_SERVICE.install(dir)?;
    let db = dir.join("sqlite-stress.db");
    if !db.exists() {
        let partial = dir.join("sqlite-stress.db.partial");
        let _ = std::fs::remove_file(&partial);
        let rows = STRESS_LIMIT * DATABASE_PERCENT / 100 / ROW_BYTES;
        let made = create(&service, &partial, rows)?;
        if made.status.code() == Some(3) {
            return Ok(Err(String::from_utf8_lossy(&made.stderr)
                .trim()
                .to_string()));
        }
        if !made.status.success() {
            return Err(create_failed(&made));
        }
        std::fs::rename(&partial, &db).map_err(|e| format!("{}: {e}", db.display()))?;
    }
    Ok(Ok((service, db)))
}

/// One trial of the stress case on the database of [`stress_database`].
pub(crate) fn stress_once(service: &Path, db: &Path) -> Result<StressRun, String> {
    let lib = libvrange()?;
    let all_kib = (STRESS_LIMIT - STRESS_LIMIT / 8) >> 10;
    let peer = Peer {
        cache: format!("vrange:{all_kib}"),
        label: "vrange_sqlite_pcache() under a sudden neighbour".into(),
        short: "vrange",
    };
    let ramp = Ramp {
        peak: STRESS_NEIGHBOUR,
        warmup: Duration::from_secs(4),
        period: Duration::from_secs(1),
        tail: Duration::from_secs(1),
    };
    let run = one(service, db, &lib, &peer, STRESS_LIMIT, &ramp)?;
    let (total, _) = run.total(|_| true);
    Ok(StressRun {
        oom_kills: run.oom_kills,
        service_kills: run.kills.len(),
        neighbour_kills: run.neighbour_kills.len(),
        ops: total.ops,
        wrong: total.wrong,
    })
}

pub fn run(ctx: &Ctx) -> Result<(), String> {
    if !ctx.memory_cgroups("sqlite") {
        return Ok(());
    }
    let lib = libvrange()?;
    let service = SQLITE_SERVICE.install(&ctx.out)?;
    let (limit, ramp) = scenario(ctx.quick());
    let db = ctx.out.join("sqlite-bench.db");
    let rows = limit * DATABASE_PERCENT / 100 / ROW_BYTES;
    progress(format!("sqlite: making a database of {rows} rows"));
    let made = create(&service, &db, rows)?;
    if made.status.code() == Some(3) {
        ctx.skipped("sqlite", String::from_utf8_lossy(&made.stderr).trim());
        return Ok(());
    }
    if !made.status.success() {
        return Err(create_failed(&made));
    }
    let db_bytes = std::fs::metadata(&db).map_err(|e| e.to_string())?.len();
    let version = Reply::parse(&String::from_utf8_lossy(&made.stdout))
        .str("sqlite")
        .to_string();
    let all_kib = (limit - limit / 8) >> 10;
    let peers = [
        Peer {
            cache: "default".into(),
            label: "SQLite's page cache, default cache_size (2 MB)".into(),
            short: "SQLite default",
        },
        Peer {
            cache: format!("all:{all_kib}"),
            label: format!(
                "SQLite's page cache, cache_size for all memory ({})",
                mib(all_kib << 10)
            ),
            short: "SQLite all memory",
        },
        Peer {
            cache: format!("vrange:{all_kib}"),
            label: format!(
                "vrange_sqlite_pcache(), cache_size for all memory ({})",
                mib(all_kib << 10)
            ),
            short: "vrange",
        },
    ];
    ctx.say(format!(
        "Scenario: a service and its neighbour in one memory cgroup of {} (no swap). The \
         service is one connection of SQLite {} (the system's library) over a database file of {} ({rows} rows, an \
         index on a second key, WAL journal, synchronous off): 75 % indexed lookups of a row \
         at random, 20 % range scans of 20 rows, 5 % transactions updating 5 rows, every row \
         read checked. The neighbour holds nothing for {} s, then ramps its resident memory \
         0 → {} ({NEIGHBOUR_PERCENT} % of the limit) → 0 over {} s (a raised cosine), then \
         nothing for {} s; the service makes itself the OOM killer's first choice, and a \
         killed service is started again after {} s with a cold cache. Each run starts with \
         the file's pages dropped from the kernel's page cache. Targets (the issue's): no OOM \
         kill with vrange, at least the default cache's operations in every second, close to \
         the big cache's while memory is free.",
        mib(limit),
        version,
        mib(db_bytes),
        ramp.warmup.as_secs(),
        mib(ramp.peak),
        ramp.period.as_secs(),
        ramp.tail.as_secs(),
        RESTART.as_secs(),
    ));
    let mut runs = Vec::new();
    for peer in &peers {
        progress(format!(
            "sqlite: {} ({} s)",
            peer.label,
            ramp.total().as_secs()
        ));
        runs.push(one(&service, &db, &lib, peer, limit, &ramp)?);
    }
    let _ = std::fs::remove_file(&db);
    for ext in ["-wal", "-shm"] {
        let mut p = db.clone().into_os_string();
        p.push(ext);
        let _ = std::fs::remove_file(p);
    }
    report(ctx, &peers, &runs, limit, &ramp)
}

fn report(ctx: &Ctx, peers: &[Peer], runs: &[Run], limit: u64, ramp: &Ramp) -> Result<(), String> {
    let n = ramp.seconds();
    // The first second of each run warms the cache from the disk: "while memory is free" counts
    // the warm-up after it and the tail.
    let free = |i: usize| i >= 1 && ramp.at(i as f64) == 0 && ramp.at(i as f64 + 1.0) == 0;
    let high = |i: usize| ramp.at(i as f64 + 0.5) >= ramp.peak / 2;
    let default = &runs[0];
    let mut table = Table::new(&[
        "peer",
        "operations/s",
        "while memory is free",
        "neighbour above half its peak",
        "worst second",
        "seconds at or above the default cache",
        "seconds without service",
        "OOM kills",
        "file reads/s",
        "read from disk",
        "peak cgroup memory",
        "wrong rows",
    ]);
    let mut csv = Csv::new(&[
        "peer",
        "second",
        "operations",
        "file_reads",
        "disk_kib",
        "wrong_rows",
        "service_rss_kib",
        "neighbour_target_bytes",
        "neighbour_rss_bytes",
        "cgroup_usage_bytes",
    ]);
    let mut series = Vec::new();
    let mut wrong = 0;
    for (peer, run) in peers.iter().zip(runs) {
        let (t, _) = run.total(|_| true);
        wrong += t.wrong;
        let worst = run.seconds.iter().map(|s| s.ops).min().unwrap_or(0);
        let at_least = (0..n)
            .filter(|&i| run.seconds[i].ops >= default.seconds[i].ops)
            .count();
        let oom = match run.oom_kills {
            None => "?".to_string(),
            Some(k) => {
                let at: Vec<String> = run.kills.iter().map(|t| format!("{t:.1} s")).collect();
                let mut s = k.to_string();
                if !at.is_empty() {
                    s += &format!(" (service at {})", at.join(", "));
                }
                if !run.neighbour_kills.is_empty() {
                    s += &format!(" (neighbour {})", run.neighbour_kills.len());
                }
                s
            }
        };
        table.row(vec![
            peer.label.clone(),
            report::rate(run.rate(|_| true)),
            report::rate(run.rate(free)),
            report::rate(run.rate(high)),
            report::rate(worst as f64),
            format!("{at_least} of {n}"),
            run.seconds
                .iter()
                .filter(|s| s.ops == 0)
                .count()
                .to_string(),
            oom,
            report::rate(t.reads as f64 / n as f64),
            mib(t.disk_kib << 10),
            run.peak.map_or("?".into(), mib),
            t.wrong.to_string(),
        ]);
        for (i, s) in run.seconds.iter().enumerate() {
            let mean =
                |f: fn(&super::service::Sample) -> u64| report::opt(run.samples.mean_in(i, f), 0);
            csv.row([
                peer.label.clone(),
                i.to_string(),
                s.ops.to_string(),
                s.reads.to_string(),
                s.disk_kib.to_string(),
                s.wrong.to_string(),
                s.rss_kib.to_string(),
                ramp.at(i as f64 + 0.5).to_string(),
                mean(|x| x.neighbour),
                mean(|x| x.usage),
            ]);
        }
        series.push(Series::new(
            peer.short,
            run.seconds
                .iter()
                .enumerate()
                .map(|(i, s)| (i as f64 + 0.5, s.ops as f64 / 1e3))
                .collect(),
        ));
    }
    ctx.table(&table);
    let (big, vr) = (&runs[1], &runs[2]);
    let vr_kills = vr
        .oom_kills
        .unwrap_or(0)
        .max((vr.kills.len() + vr.neighbour_kills.len()) as u64);
    let below: Vec<usize> = (0..n)
        .filter(|&i| vr.seconds[i].ops < default.seconds[i].ops)
        .collect();
    let mut targets = Table::new(&["target", "result"]);
    let verdict = |met: bool| if met { "met" } else { "MISSED" };
    targets.row(vec![
        "no OOM kill with vrange".into(),
        format!("{}: {vr_kills} OOM kills", verdict(vr_kills == 0)),
    ]);
    targets.row(vec![
        "vrange's operations ≥ the default cache's, every second".into(),
        if below.is_empty() {
            format!("met: {n} of {n} seconds")
        } else {
            format!(
                "MISSED in {} of {n} seconds: {}",
                below.len(),
                below
                    .iter()
                    .take(8)
                    .map(|&i| format!(
                        "second {i} ({:.0} %)",
                        100.0 * vr.seconds[i].ops as f64 / default.seconds[i].ops.max(1) as f64
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        },
    ]);
    let ratio = vr.rate(free) / big.rate(free).max(1.0);
    targets.row(vec![
        "close to the big cache's operations while memory is free".into(),
        format!(
            "{:.2}× ({} against {} operations/s)",
            ratio,
            report::rate(vr.rate(free)),
            report::rate(big.rate(free))
        ),
    ]);
    targets.row(wrong_row("rows", wrong));
    ctx.table(&targets);
    csv.write(&ctx.out, "sqlite-seconds.csv")?;
    plot_over_time(
        ctx,
        "sqlite",
        format!(
            "SQLite operations while a neighbour takes up to {NEIGHBOUR_PERCENT} % of a {} cgroup",
            mib(limit)
        ),
        "thousand operations/s; neighbour memory (% of the limit)",
        series,
        &vr.samples,
        n,
        limit,
    )?;
    if wrong > 0 {
        return Err(format!("{wrong} wrong rows read"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Second;

    #[test]
    fn a_service_line_parses() {
        let (n, s) =
            Second::parse("sec n=3 ops=10 reads=4 disk_kib=8 wrong=0 rss_kib=100").unwrap();
        assert_eq!(
            (n, s.ops, s.reads, s.disk_kib, s.rss_kib),
            (3, 10, 4, 8, 100)
        );
        assert!(Second::parse("done").is_none());
    }
}
