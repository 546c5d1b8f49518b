//! The scenario: a service and its ramping neighbour in one memory cgroup, per peer.

use super::*;

// ---------------------------------------------------------------------------------------
// The scenario's processes.

/// The number of keys whose values total `bytes`.
pub(crate) fn keys_for(bytes: u64) -> u64 {
    let (mut k, mut total) = (0u64, 0u64);
    while total < bytes {
        total += len_of(k) as u64;
        k += 1;
    }
    k
}

/// `service PEER CAPACITY KEYS EPOCH_NS END_NS ZIPF [RATE [DRIFT [WORK]]]`: answers requests
/// from the epoch to the end (as fast as it can, or RATE per second: a steady load), printing
/// `sec n= req= hit= purged= wrong= failed= bytes=` for every second. With DRIFT (keys per
/// second), the KEYS drawn move on as time passes: the key of Zipf rank r at t seconds is
/// `floor(t × DRIFT) + r`, so yesterday's popular keys turn cold (new content replacing old).
/// WORK: the units of CPU work each miss costs besides writing its value ([`miss_work`]).
pub(crate) fn service_role(args: &[String]) -> i32 {
    let usage = || {
        eprintln!(
            "usage: vrange-bench role cache service PEER CAPACITY KEYS EPOCH END ZIPF [RATE \
             [DRIFT [WORK]]]"
        );
        2
    };
    let (Some((peer, rest)), true) = (args.split_first(), (6..=9).contains(&args.len())) else {
        return usage();
    };
    // ZIPF (the fifth after PEER) is a fraction; every other argument a count.
    let counts: Option<Vec<u64>> = rest
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != 4)
        .map(|(_, a)| a.parse().ok())
        .collect();
    let (Some(counts), Ok(zipf)) = (counts, rest[4].parse::<f64>()) else {
        eprintln!("cache service role: bad numbers");
        return 2;
    };
    let at = |i: usize| counts.get(i).copied().unwrap_or(0);
    let (capacity, keys, epoch, end) = (at(0), at(1), at(2), at(3));
    let load = Load {
        epoch,
        end,
        rate: at(4),
        drift: at(5),
        work: at(6),
    };
    // The OOM killer's first choice, so that the neighbour is spared (lowering the
    // neighbour's score instead would need CAP_SYS_RESOURCE).
    let _ = vrange_testkit::hog::prefer_oom_kill();
    let zipf = Zipf::new(keys as usize, zipf);
    let seed = u64::from(std::process::id());
    match peer.as_str() {
        "vrange-cache" => serve(&Vr(Cache::new(Options::default())), &zipf, &load, seed),
        "quick_cache" => serve(&quick(capacity, 34 << 10), &zipf, &load, seed),
        other => {
            eprintln!("cache service role: unknown peer {other}");
            2
        }
    }
}

/// When the service runs and what its requests cost (the role's arguments).
struct Load {
    epoch: u64,
    end: u64,
    /// Requests per second (0: as fast as it can).
    rate: u64,
    /// Keys per second the popular ones move on by.
    drift: u64,
    /// Units of [`miss_work`] per miss.
    work: u64,
}

fn serve(store: &impl Store, zipf: &Zipf, load: &Load, seed: u64) -> i32 {
    let Load {
        epoch,
        end,
        rate,
        drift,
        work,
    } = *load;
    sleep_until(epoch);
    let mut worked = 0u64;
    let mut rng = Rng::new(seed);
    let mut sec = now_ns().saturating_sub(epoch) / SEC;
    let mut c = Second::default();
    let mut served = 0u64;
    loop {
        // A steady load: the next 16 requests are due when the rate says.
        if let Some(due) = served.saturating_mul(SEC).checked_div(rate) {
            sleep_until(epoch.saturating_add(due));
        }
        served += 16;
        let offset = now_ns().saturating_sub(epoch).saturating_mul(drift) / SEC;
        for _ in 0..16 {
            let key = offset + zipf.sample(&mut rng) as u64;
            let len = len_of(key);
            c.req += 1;
            let found = store.with(key, |f| match f {
                Found::Hit(v) => {
                    c.hit += 1;
                    c.wrong += u64::from(!check(key, len, v));
                    true
                }
                Found::Purged => {
                    c.purged += 1;
                    false
                }
                Found::Absent => false,
            });
            if !found {
                worked ^= miss_work(key, work);
                if !store.regenerate(key, len) {
                    c.failed += 1;
                }
            }
        }
        let now = now_ns();
        let n = now.saturating_sub(epoch) / SEC;
        if n != sec || now >= end {
            c.bytes = store.bytes();
            println!("{}", c.line(sec));
            (sec, c) = (n, Second::default());
        }
        if now >= end {
            break;
        }
    }
    // The work's result, so that it cannot be optimised away.
    println!("done {}", worked & 1);
    0
}

// ---------------------------------------------------------------------------------------
// The suite: the scenario.

struct Scenario {
    limit: u64,
    neighbour: Ramp,
    keys: u64,
}

impl Scenario {
    /// The suite's scenario: a 512 MiB cgroup, 10 s of warm-up, a 60 s ramp and a 5 s tail;
    /// `quick`: 128 MiB, 2 s, 15 s and 1 s.
    fn new(quick: bool) -> Scenario {
        let limit = if quick { 128 * MIB } else { 512 * MIB };
        Scenario {
            limit,
            neighbour: Ramp {
                peak: limit * NEIGHBOUR_PERCENT / 100,
                warmup: Duration::from_secs(if quick { 2 } else { 10 }),
                period: Duration::from_secs(if quick { 15 } else { 60 }),
                tail: Duration::from_secs(if quick { 1 } else { 5 }),
            },
            keys: keys_for(3 * limit),
        }
    }
}

/// A peer of the scenario.
struct ScenarioPeer {
    /// The role's store.
    store: &'static str,
    label: String,
    short: String,
    /// Bytes (0: none, vrange-cache).
    capacity: u64,
}

impl ScenarioPeer {
    /// vrange-cache with no capacity: vrange's reclaimer at default settings.
    fn vrange_cache() -> ScenarioPeer {
        ScenarioPeer {
            store: "vrange-cache",
            label: "vrange-cache, no capacity".into(),
            short: "vrange-cache".into(),
            capacity: 0,
        }
    }
}

struct Run {
    seconds: Seconds,
    samples: Samples,
    /// Seconds after the epoch at which the service was found killed.
    kills: Vec<f64>,
    starts: usize,
    oom_kills: Option<u64>,
    peak: Option<u64>,
    /// Seconds after the epoch at which the neighbour was found killed (and started again).
    neighbour_kills: Vec<f64>,
}

/// One run of the scenario for `peer`, whose misses cost `work` units of [`miss_work`].
fn scenario_one(s: &Scenario, peer: &ScenarioPeer, work: u64) -> Result<Run, String> {
    let cg = cgroup::try_child("vrange-bench-cache", s.limit)?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let spawn = |args: &[String]| -> Result<Proc, String> {
        let mut cmd = clean_command(&exe);
        cmd.arg("role").args(args).env("VRANGE_STATS_DIR", "off");
        cgroup::join(&mut cmd, cg.cgroup())?;
        Proc::try_spawn(cmd)
    };
    let epoch = now_ns() + SEC / 2;
    let end = epoch + s.neighbour.total().as_nanos() as u64;
    let neighbour = Neighbour::start(spawn, s.neighbour.role_args(epoch, end))?;
    let service_args: Vec<String> = vec![
        "cache".into(),
        "service".into(),
        peer.store.into(),
        peer.capacity.to_string(),
        s.keys.to_string(),
        epoch.to_string(),
        end.to_string(),
        ZIPF.to_string(),
        "0".into(),
        "0".into(),
        work.to_string(),
    ];
    let mut seconds = Seconds::new(s.neighbour.seconds());
    let seen = supervise(
        &peer.label,
        cg.cgroup(),
        (epoch, end),
        neighbour,
        spawn,
        || spawn(&service_args),
        |line| {
            seconds.take(line);
        },
    )?;
    Ok(Run {
        seconds,
        samples: seen.samples,
        kills: seen.kills,
        starts: seen.starts,
        oom_kills: cg.cgroup().oom_kills().ok(),
        peak: cgroup::peak(cg.cgroup()),
        neighbour_kills: seen.neighbour_kills,
    })
}

/// What one run of the scenario (the `quick` one or the suite's) did to vrange-cache's
/// service: the stress suite's trial.
pub(crate) struct VrangeCacheRun {
    /// OOM kills in the scenario's cgroup (`None`: the counter could not be read).
    pub oom_kills: Option<u64>,
    /// Times the service and the neighbour were found killed (and started again).
    pub service_kills: usize,
    pub neighbour_kills: usize,
    /// Hits over requests, the whole run.
    pub hit_rate: f64,
    /// Values read wrong (must be 0).
    pub wrong: u64,
}

/// One run of the scenario for vrange-cache alone.
pub(crate) fn vrange_cache_run(quick: bool) -> Result<VrangeCacheRun, String> {
    let run = scenario_one(&Scenario::new(quick), &ScenarioPeer::vrange_cache(), 0)?;
    let total = run.seconds.total();
    Ok(VrangeCacheRun {
        oom_kills: run.oom_kills,
        service_kills: run.kills.len(),
        neighbour_kills: run.neighbour_kills.len(),
        hit_rate: total.rate(),
        wrong: total.wrong,
    })
}

pub(super) fn scenario(ctx: &Ctx) -> Result<(), String> {
    if !ctx.memory_cgroups("cache scenario") {
        return Ok(());
    }
    let s = Scenario::new(ctx.quick());
    let limit = s.limit;
    let slack = limit / 8;
    let full = limit - slack;
    let conservative = limit - s.neighbour.peak - slack;
    let peers = [
        ScenarioPeer::vrange_cache(),
        ScenarioPeer {
            store: "quick_cache",
            label: format!("quick_cache, sized conservatively: {}", mib(conservative)),
            short: format!("quick_cache {}", mib(conservative)),
            capacity: conservative,
        },
        ScenarioPeer {
            store: "quick_cache",
            label: format!("quick_cache, sized for the container: {}", mib(full)),
            short: format!("quick_cache {}", mib(full)),
            capacity: full,
        },
    ];
    ctx.say(format!(
        "Scenario: a service and its neighbour in one memory cgroup of {} (no swap). The \
         service answers requests for {} keys drawn from a Zipf law (s = {ZIPF}); values of \
         4 to 64 KiB total {} (three times the limit); a hit checks every byte, a miss \
         regenerates the value (a pattern from the key) and inserts it. The neighbour holds \
         nothing for {} s, then ramps its resident memory 0 → {} ({NEIGHBOUR_PERCENT} % of the \
         limit) → 0 over {} s (a raised cosine), then nothing for {} s; the service makes \
         itself the OOM killer's first choice (oom_score_adj 1000), so the neighbour is \
         spared. A killed service is restarted after {} s with an empty cache. quick_cache \
         is sized for the container (the limit less {} for the process) or conservatively \
         (also less the neighbour's peak); vrange-cache has no capacity and default vrange \
         settings (VRANGE_HEADROOM=auto: {} here). Targets: no OOM kill for vrange-cache, \
         and its hit rate in every second at least the conservative peer's.",
        mib(limit),
        s.keys,
        mib(3 * limit),
        s.neighbour.warmup.as_secs(),
        mib(s.neighbour.peak),
        s.neighbour.period.as_secs(),
        s.neighbour.tail.as_secs(),
        RESTART.as_secs(),
        mib(slack),
        mib(headroom(limit)),
    ));
    let costs = ctx.args.miss_cost.clone().unwrap_or_else(|| {
        if ctx.quick() {
            vec![0]
        } else {
            vec![0, 20, 200]
        }
    });
    ctx.say(format!(
        "Miss costs: {} µs of real CPU work per miss besides writing the value (SipHash \
         rounds over a block, calibrated on this machine once for every peer); the cache \
         sized for the container runs at the first cost only.",
        costs
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let mut cells = Vec::new();
    for (i, &cost) in costs.iter().enumerate() {
        let work = work_units(Duration::from_micros(cost));
        for peer in peers.iter().filter(|p| i == 0 || p.capacity != full) {
            progress(format!(
                "cache: scenario, {}, misses cost {cost} µs ({} s)",
                peer.label,
                s.neighbour.total().as_secs()
            ));
            let run = scenario_one(&s, peer, work)?;
            cells.push(Cell { cost, peer, run });
        }
    }
    let n = s.neighbour.seconds();
    let high = |i: usize| s.neighbour.at(i as f64 + 0.5) >= s.neighbour.peak / 2;
    let mut table = Table::new(&[
        "miss cost",
        "peer",
        "requests/s",
        "hit rate",
        "hit rate, hog above half its peak",
        "worst second",
        "seconds without service",
        "OOM kills",
        "service killed at (hog's memory)",
        "peak cgroup memory",
        "wrong values",
        "purged lookups",
    ]);
    let mut csv = Csv::new(&[
        "miss_cost_us",
        "peer",
        "capacity_bytes",
        "limit_bytes",
        "requests",
        "hits",
        "hit_rate",
        "hit_rate_hog_high",
        "worst_second_hit_rate",
        "seconds_without_service",
        "oom_kills",
        "service_killed_at_s",
        "neighbour_killed_at_s",
        "service_starts",
        "peak_cgroup_bytes",
        "wrong_values",
        "purged_lookups",
        "refused_inserts",
    ]);
    let mut seconds_csv = Csv::new(&[
        "miss_cost_us",
        "peer",
        "second",
        "requests",
        "hits",
        "hit_rate",
        "purged_lookups",
        "cache_bytes",
        "hog_target_bytes",
        "hog_rss_bytes",
        "service_rss_bytes",
        "cgroup_usage_bytes",
    ]);
    let mut series = Vec::new();
    let mut wrong = 0u64;
    for Cell { cost, peer, run } in &cells {
        let t = run.seconds.total();
        wrong += t.wrong;
        let worst = run
            .seconds
            .iter()
            .map(Second::rate)
            .fold(f64::MAX, f64::min);
        let killed: Vec<String> = run
            .kills
            .iter()
            .map(|&k| {
                format!(
                    "{k:.1} s ({:.0} %)",
                    100.0 * s.neighbour.at(k) as f64 / limit as f64
                )
            })
            .collect();
        let killed = if killed.len() > 4 {
            format!(
                "{}, ... {}",
                killed[..3].join(", "),
                killed[killed.len() - 1]
            )
        } else if killed.is_empty() {
            "–".into()
        } else {
            killed.join(", ")
        };
        let oom = match run.oom_kills {
            None => "?".into(),
            Some(k) if run.neighbour_kills.is_empty() => k.to_string(),
            Some(k) => format!(
                "{k} (neighbour {}: at {})",
                run.neighbour_kills.len(),
                run.neighbour_kills
                    .iter()
                    .map(|t| format!("{t:.1} s"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        let without = run.seconds.iter().filter(|x| x.req == 0).count();
        table.row(vec![
            format!("{cost} µs"),
            peer.label.clone(),
            report::rate(run.requests_per_s(&s)),
            pct(t.rate()),
            pct(run.seconds.rate_where(high)),
            pct(worst),
            without.to_string(),
            oom,
            killed,
            run.peak.map_or("?".into(), mib),
            t.wrong.to_string(),
            if peer.capacity == 0 {
                t.purged.to_string()
            } else {
                "–".into()
            },
        ]);
        csv.row([
            cost.to_string(),
            peer.label.clone(),
            peer.capacity.to_string(),
            limit.to_string(),
            t.req.to_string(),
            t.hit.to_string(),
            format!("{:.4}", t.rate()),
            format!("{:.4}", run.seconds.rate_where(high)),
            format!("{worst:.4}"),
            without.to_string(),
            run.oom_kills.map_or(String::new(), |k| k.to_string()),
            run.kills
                .iter()
                .map(|k| format!("{k:.1}"))
                .collect::<Vec<_>>()
                .join(" "),
            run.neighbour_kills
                .iter()
                .map(|k| format!("{k:.1}"))
                .collect::<Vec<_>>()
                .join(" "),
            run.starts.to_string(),
            run.peak.map_or(String::new(), |p| p.to_string()),
            t.wrong.to_string(),
            t.purged.to_string(),
            t.failed.to_string(),
        ]);
        for (i, sec) in run.seconds.iter().enumerate() {
            let mean = |f: fn(&Sample) -> u64| report::opt(run.samples.mean_in(i, f), 0);
            seconds_csv.row([
                cost.to_string(),
                peer.label.clone(),
                i.to_string(),
                sec.req.to_string(),
                sec.hit.to_string(),
                format!("{:.4}", sec.rate()),
                sec.purged.to_string(),
                sec.bytes.to_string(),
                s.neighbour.at(i as f64 + 0.5).to_string(),
                mean(|x| x.neighbour),
                mean(|x| x.service),
                mean(|x| x.usage),
            ]);
        }
        if *cost == costs[0] {
            series.push(Series::new(
                peer.short.clone(),
                run.seconds
                    .iter()
                    .enumerate()
                    .map(|(i, sec)| (i as f64 + 0.5, 100.0 * sec.rate()))
                    .collect(),
            ));
        }
    }
    ctx.table(&table);
    let mut targets = Table::new(&["target", "result"]);
    for &cost in &costs {
        let at = |capacity: u64| {
            cells
                .iter()
                .find(|c| c.cost == cost && c.peer.capacity == capacity)
                .map(|c| &c.run)
                .expect("every cost runs vrange-cache and the conservative peer")
        };
        let (vr, cons) = (at(0), at(conservative));
        let vr_kills = vr
            .oom_kills
            .unwrap_or(0)
            .max((vr.kills.len() + vr.neighbour_kills.len()) as u64);
        targets.row(vec![
            format!("misses cost {cost} µs: no OOM kill for vrange-cache"),
            if vr_kills == 0 {
                "met: 0 OOM kills".into()
            } else {
                format!("MISSED: {vr_kills} kills")
            },
        ]);
        let want = if cost == 0 { 0.9 } else { 1.0 };
        let ratio = vr.requests_per_s(&s) / cons.requests_per_s(&s);
        targets.row(vec![
            format!("misses cost {cost} µs: requests/s ≥ {want}× the conservative peer's"),
            format!(
                "{}: {ratio:.3}× ({} against {})",
                if ratio >= want { "met" } else { "MISSED" },
                report::rate(vr.requests_per_s(&s)),
                report::rate(cons.requests_per_s(&s))
            ),
        ]);
        targets.row(vec![
            format!(
                "misses cost {cost} µs: vrange-cache's hit rate ≥ the conservative peer's, \
                 every second"
            ),
            every_second(&s, vr, cons),
        ]);
    }
    targets.row(wrong_row("values", wrong));
    ctx.table(&targets);
    csv.write(&ctx.out, "cache-scenario.csv")?;
    seconds_csv.write(&ctx.out, "cache-seconds.csv")?;
    // The first cost's hit rates; the neighbour, as measured during the first run, in percent
    // of the limit.
    plot_over_time(
        ctx,
        "cache",
        format!(
            "Cache hit rate while a neighbour takes up to {NEIGHBOUR_PERCENT} % of a {} cgroup",
            mib(limit)
        ),
        "hit rate (%), neighbour memory (% of the limit)",
        series,
        &cells[0].run.samples,
        n,
        limit,
    )?;
    if wrong > 0 {
        return Err(format!("{wrong} wrong values read from the caches"));
    }
    Ok(())
}

/// A peer's run at one miss cost.
struct Cell<'a> {
    /// Microseconds of CPU work per miss.
    cost: u64,
    peer: &'a ScenarioPeer,
    run: Run,
}

impl Run {
    /// Requests answered per second of the scenario.
    fn requests_per_s(&self, s: &Scenario) -> f64 {
        self.seconds.total().req as f64 / s.neighbour.total().as_secs_f64()
    }
}

/// The hit-rate target's result: `vr`'s hit rate at least `cons`'s in every second.
fn every_second(s: &Scenario, vr: &Run, cons: &Run) -> String {
    let n = s.neighbour.seconds();
    let limit = s.limit;
    let deficits: Vec<(usize, f64)> = (0..n)
        .map(|i| (i, vr.seconds[i].rate() - cons.seconds[i].rate()))
        .filter(|(_, d)| *d < 0.0)
        .collect();
    let worst = deficits
        .iter()
        .copied()
        .fold(None, |w: Option<(usize, f64)>, d| match w {
            Some(w) if w.1 <= d.1 => Some(w),
            _ => Some(d),
        });
    let hog = |i: usize| 100.0 * s.neighbour.at(i as f64 + 0.5) as f64 / limit as f64;
    match worst {
        None => format!("met: {n} of {n} seconds"),
        Some((i, d)) => format!(
            "MISSED in {} of {n} seconds (the hog at {:.0} % of the limit or more); worst: \
             second {i}, {:.1} points below ({} vs {}; hog at {:.0} % of the limit)",
            deficits.len(),
            deficits
                .iter()
                .map(|&(i, _)| hog(i))
                .fold(f64::MAX, f64::min),
            -d * 100.0,
            pct(vr.seconds[i].rate()),
            pct(cons.seconds[i].rate()),
            hog(i)
        ),
    }
}
