//! The hot path: hits and inserts of every peer, each in a process of its own.

use super::*;

// ---------------------------------------------------------------------------------------
// The hot path, in the role process.

/// `hot PEER SIZE OPS RUNS`: prints `insert threads=T secs= minflt=` and
/// `hit threads=T ns= min= max=` for each thread count.
pub(super) fn hot_role(args: &[String]) -> i32 {
    let [peer, size, ops, runs] = args else {
        eprintln!("usage: vrange-bench role cache hot PEER SIZE OPS RUNS");
        return 2;
    };
    let (Ok(size), Ok(ops), Ok(runs)) = (size.parse(), ops.parse(), runs.parse()) else {
        eprintln!("cache hot role: bad numbers");
        return 2;
    };
    let h = Hot { size, ops, runs };
    // Twice the working set: nothing is evicted.
    let cap = 2 * WORKING_SET as u64;
    let r = match peer.as_str() {
        "vrange-cache" => h.run(|| Vr(Cache::new(Options::default()))),
        "moka" => h.run(|| {
            Moka::builder()
                .max_capacity(cap)
                .weigher(|_, v: &Arc<[u8]>| u32::try_from(v.len()).unwrap_or(u32::MAX))
                .build()
        }),
        "quick_cache" => h.run(|| quick(cap, size as u64)),
        "lru" => h.run(|| Mutex::new(lru::LruCache::unbounded())),
        other => Err(format!("unknown peer {other}")),
    };
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("cache hot role: {peer}: {e}");
            1
        }
    }
}

struct Hot {
    size: usize,
    ops: usize,
    runs: usize,
}

impl Hot {
    fn run<S: Store>(&self, make: impl Fn() -> S) -> Result<(), String> {
        let keys = (WORKING_SET / self.size).max(1) as u64;
        let mut value = vec![0u8; self.size];
        fill(1, &mut value);
        for threads in THREADS {
            let (mut secs, mut faults) = (Vec::new(), Vec::new());
            for _ in 0..self.runs {
                let c = make();
                let f0 = minor_faults();
                let t0 = Instant::now();
                let refused = std::thread::scope(|s| {
                    let handles: Vec<_> = (0..threads)
                        .map(|t| {
                            let (c, value) = (&c, &value);
                            s.spawn(move || {
                                (t as u64..keys)
                                    .step_by(threads)
                                    .filter(|&k| !c.insert(k, value))
                                    .count()
                            })
                        })
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| h.join().unwrap_or(1))
                        .sum::<usize>()
                });
                c.settle();
                secs.push(t0.elapsed().as_secs_f64());
                faults.push((minor_faults() - f0) as f64);
                if refused > 0 {
                    return Err(format!("{refused} inserts refused"));
                }
            }
            println!(
                "insert threads={threads} secs={:.6} minflt={:.0}",
                report::median(&mut secs).unwrap_or(0.0),
                report::median(&mut faults).unwrap_or(0.0)
            );
        }
        let c = make();
        for k in 0..keys {
            if !c.insert(k, &value) {
                return Err(format!("insert of key {k} refused"));
            }
        }
        c.settle();
        for threads in THREADS {
            // Each thread its own sequence of random keys, made before the clock starts.
            let seqs: Vec<Vec<u32>> = (0..threads)
                .map(|t| {
                    let mut rng = Rng::new(t as u64 + 1);
                    (0..self.ops).map(|_| (rng.next() % keys) as u32).collect()
                })
                .collect();
            let mut ns = Vec::new();
            // One warm-up run, then the measured ones.
            for run in 0..=self.runs {
                let barrier = Barrier::new(threads);
                let per: Vec<(f64, Misses, u64)> = std::thread::scope(|s| {
                    let handles: Vec<_> = seqs
                        .iter()
                        .map(|seq| {
                            let (c, barrier) = (&c, &barrier);
                            s.spawn(move || {
                                barrier.wait();
                                let t0 = Instant::now();
                                let (mut sum, mut missing) = (0u64, Misses::default());
                                for &k in seq {
                                    c.with(u64::from(k), |f| match f {
                                        Found::Hit(v) => {
                                            sum += u64::from(v[0]) + u64::from(v[v.len() - 1])
                                        }
                                        Found::Absent => missing.absent += 1,
                                        Found::Purged => missing.purged += 1,
                                    });
                                }
                                let t = t0.elapsed().as_secs_f64();
                                (
                                    t * 1e9 / seq.len() as f64,
                                    missing,
                                    std::hint::black_box(sum),
                                )
                            })
                        })
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| {
                            let panicked = Misses {
                                absent: 1,
                                purged: 0,
                            };
                            h.join().unwrap_or((f64::NAN, panicked, 0))
                        })
                        .collect()
                });
                let absent: u64 = per.iter().map(|p| p.1.absent).sum();
                let purged: u64 = per.iter().map(|p| p.1.purged).sum();
                if absent + purged > 0 {
                    return Err(format!(
                        "lookups of present keys missed: {absent} found no entry, {purged} found \
                         it purged ({})",
                        purges_by_source()
                    ));
                }
                if run > 0 {
                    ns.push(per.iter().map(|p| p.0).sum::<f64>() / threads as f64);
                }
            }
            let (lo, hi) = ns
                .iter()
                .fold((f64::MAX, 0f64), |(a, b), &v| (a.min(v), b.max(v)));
            println!(
                "hit threads={threads} ns={:.2} min={lo:.2} max={hi:.2}",
                report::median(&mut ns).unwrap_or(f64::NAN)
            );
        }
        Ok(())
    }
}

/// Lookups of keys that were inserted and should still be there.
#[derive(Clone, Copy, Default)]
struct Misses {
    absent: u64,
    purged: u64,
}

/// What purged in this process, for the error a miss reports.
fn purges_by_source() -> String {
    let st = vrange::stats();
    let by: Vec<String> = vrange::Source::ALL
        .iter()
        .zip(st.sources)
        .filter(|(_, s)| s.events > 0 || s.bytes > 0)
        .map(|(src, s)| format!("{}: {} events, {} bytes", src.name(), s.events, s.bytes))
        .collect();
    if by.is_empty() {
        "no purge in this process".into()
    } else {
        format!("purges by source: {}", by.join("; "))
    }
}

// ---------------------------------------------------------------------------------------
// The suite: the hot path.

#[derive(Clone, Copy, Default)]
struct HotResult {
    /// By thread count (THREADS order): median ns per hit, min, max; insert seconds, faults.
    hit: [(f64, f64, f64); 2],
    insert: [(f64, f64); 2],
}

fn hot_one(peer: &str, size: usize, ops: usize, runs: usize) -> Result<HotResult, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = clean_command(&exe);
    cmd.args(["role", "cache", "hot", peer])
        .args([size.to_string(), ops.to_string(), runs.to_string()])
        .env("VRANGE_STATS_DIR", "off");
    // Nothing evicts from the peers; pressure elsewhere on the machine (system-wide PSI, the
    // only global signal on cgroup v1) must not purge vrange-cache's entries mid-measurement
    // either. Its reclaimer still runs and arms.
    for name in ["VRANGE_PSI", "VRANGE_VMPRESSURE", "VRANGE_HEADROOM"] {
        cmd.env(name, "off");
    }
    let mut p = Proc::try_spawn(cmd)?;
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut r = HotResult::default();
    for _ in 0..2 * THREADS.len() {
        let Some(line) = p.line("", deadline) else {
            let exit = p.wait(Duration::from_secs(5));
            return Err(format!("{peer} {size}: {exit}: {}", p.stderr().trim()));
        };
        let t: usize = field(&line, "threads").unwrap_or(0);
        let i = THREADS.iter().position(|&n| n == t).ok_or(line.clone())?;
        let get = |k| field::<f64>(&line, k).ok_or_else(|| format!("no {k} in {line:?}"));
        if line.starts_with("insert") {
            r.insert[i] = (get("secs")?, get("minflt")?);
        } else if line.starts_with("hit") {
            r.hit[i] = (get("ns")?, get("min")?, get("max")?);
        }
    }
    let exit = p.wait(Duration::from_secs(30));
    if exit != Exit::Code(0) {
        return Err(format!("{peer} {size}: {exit}: {}", p.stderr().trim()));
    }
    Ok(r)
}

pub(super) fn hot_path(ctx: &Ctx) -> Result<(), String> {
    let (ops, runs) = if ctx.quick() {
        (30_000, 3)
    } else {
        (400_000, 9)
    };
    ctx.say(format!(
        "Hot path: {} of values per size under u64 keys, each peer in a process of its own. \
         A hit: get a present key, read the value's first and last byte, drop the handle \
         (vrange-cache's Entry, the peers' Arc<[u8]> clone); {ops} random keys per thread and \
         run, the median of {runs} runs, in ns per hit on each thread. Inserts: values copied \
         into a fresh cache, keys split between the threads (median of {runs} runs). The \
         peers' capacity is twice the working set (nothing is evicted); each uses its default \
         hasher; vrange-cache's pressure sources are off (VRANGE_PSI, VRANGE_VMPRESSURE, \
         VRANGE_HEADROOM), so that pressure elsewhere on the machine purges nothing \
         mid-measurement. Target: a vrange-cache hit within {HIT_TARGET}× of the fastest peer's.",
        report::size(WORKING_SET)
    ));
    let mut results = Vec::new();
    for size in SIZES {
        let mut row = Vec::new();
        for (peer, _) in PEERS {
            progress(format!("cache: hot path, {peer}, {}", report::size(size)));
            row.push(hot_one(peer, size, ops, runs)?);
        }
        results.push((size, row));
    }
    let mut peers = Table::new(&["peer", "what"]);
    for (p, what) in PEERS {
        peers.row(vec![p.into(), what.into()]);
    }
    ctx.table(&peers);
    let mut head = vec!["value", "threads"];
    head.extend(PEERS.iter().map(|p| p.0));
    head.extend(["vrange-cache / fastest peer", "target ≤ 1.5×"]);
    let mut hits = Table::new(&head);
    let mut head = vec!["value", "threads"];
    head.extend(PEERS.iter().map(|p| p.0));
    head.push("vrange-cache / fastest peer");
    let mut inserts = Table::new(&head);
    let mut csv = Csv::new(&[
        "peer",
        "value_bytes",
        "threads",
        "keys",
        "hit_ns",
        "hit_ns_min",
        "hit_ns_max",
        "insert_secs",
        "insert_mb_per_s",
        "inserts_per_s",
        "insert_minor_faults",
    ]);
    let mut bars: Vec<(String, Vec<Option<f64>>)> = PEERS
        .iter()
        .map(|p| (p.0.to_string(), Vec::new()))
        .collect();
    let mut categories = Vec::new();
    for (size, row) in &results {
        let keys = WORKING_SET / size;
        for (i, threads) in THREADS.iter().enumerate() {
            let ns: Vec<f64> = row.iter().map(|r| r.hit[i].0).collect();
            let fastest = ns[1..].iter().copied().fold(f64::MAX, f64::min);
            let ratio = ns[0] / fastest;
            let mut cells = vec![report::size(*size), threads.to_string()];
            cells.extend(ns.iter().map(|&n| report::ns(n)));
            cells.push(report::times(Some(ratio)));
            cells.push(if ratio <= HIT_TARGET {
                "met".into()
            } else {
                format!("missed by {:.0} %", (ratio / HIT_TARGET - 1.0) * 100.0)
            });
            hits.row(cells);
            let mbs: Vec<f64> = row
                .iter()
                .map(|r| (keys * size) as f64 / 1e6 / r.insert[i].0)
                .collect();
            let best = mbs[1..].iter().copied().fold(0.0, f64::max);
            let mut cells = vec![report::size(*size), threads.to_string()];
            cells.extend(
                mbs.iter()
                    .map(|&m| format!("{m:.0} MB/s ({}/s)", report::rate(m * 1e6 / *size as f64))),
            );
            cells.push(report::times(Some(mbs[0] / best)));
            inserts.row(cells);
            for (k, (peer, _)) in PEERS.iter().enumerate() {
                let r = &row[k];
                csv.row([
                    peer.to_string(),
                    size.to_string(),
                    threads.to_string(),
                    keys.to_string(),
                    format!("{:.2}", r.hit[i].0),
                    format!("{:.2}", r.hit[i].1),
                    format!("{:.2}", r.hit[i].2),
                    format!("{:.6}", r.insert[i].0),
                    format!("{:.1}", mbs[k]),
                    format!("{:.0}", mbs[k] * 1e6 / *size as f64),
                    format!("{:.0}", r.insert[i].1),
                ]);
                bars[k].1.push(Some(r.hit[i].0));
            }
            categories.push(format!(
                "{}, {threads} thread{}",
                report::size(*size),
                if *threads == 1 { "" } else { "s" }
            ));
        }
    }
    ctx.say("Hits (median ns per hit on each thread; lower is better):");
    ctx.table(&hits);
    ctx.say("Inserts (values copied in; higher is better):");
    ctx.table(&inserts);
    csv.write(&ctx.out, "cache-hot.csv")?;
    let svg = plot::bars(
        &ctx.figure("Cache hit: get + first and last byte + drop"),
        &categories,
        &Axis::log("time per hit", Unit::Nanoseconds),
        &bars,
    );
    report::write_file(&ctx.out, "cache-hot.svg", &svg)?;
    Ok(())
}
