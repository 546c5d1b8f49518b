//! The scenario: a service and its ramping neighbour in one memory cgroup, per peer.

use super::*;

// ---------------------------------------------------------------------------------------
// The scenario's processes.

/// The hog's resident bytes at `t_ms` after the epoch: none during the warm-up, then a
/// raised cosine 0 → `peak` → 0 over `period_ms`, then none.
pub(super) fn hog_target(peak: u64, warmup_ms: u64, period_ms: u64, t_ms: u64) -> u64 {
    if t_ms < warmup_ms || t_ms >= warmup_ms + period_ms {
        return 0;
    }
    let x = (t_ms - warmup_ms) as f64 / period_ms as f64;
    (peak as f64 * (1.0 - (2.0 * std::f64::consts::PI * x).cos()) / 2.0) as u64
}

/// `hog PEAK EPOCH_NS WARMUP_MS PERIOD_MS END_NS`: resident memory following
/// [`hog_target`] (pages written as it grows, dropped as it shrinks) until `END_NS`.
pub(super) fn hog_role(args: &[String]) -> i32 {
    let nums: Vec<u64> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let &[peak, epoch, warmup_ms, period_ms, end] = nums.as_slice() else {
        eprintln!("usage: vrange-bench role cache hog PEAK EPOCH_NS WARMUP_MS PERIOD_MS END_NS");
        return 2;
    };
    let page = vrange::page_size();
    let bytes = (peak as usize).next_multiple_of(page).max(page);
    let Ok(p) = vrange_sys::mem::map_anon(bytes, page) else {
        eprintln!("cache hog: cannot map {bytes} bytes");
        return 1;
    };
    println!("ready");
    let mut held = 0usize;
    loop {
        let now = now_ns();
        if now >= end {
            break;
        }
        let t_ms = now.saturating_sub(epoch) / 1_000_000;
        let target =
            (hog_target(peak, warmup_ms, period_ms, t_ms) as usize).min(bytes) / page * page;
        if target > held {
            for off in (held..target).step_by(page) {
                // SAFETY: inside the hog's own mapping.
                unsafe { p.as_ptr().add(off).write_volatile(1) };
            }
        } else if target < held {
            // SAFETY: the hog's own pages; nothing refers to their content.
            let _ = unsafe { vrange_sys::mem::purge_forced(p.as_ptr().add(target), held - target) };
        }
        held = target;
        std::thread::sleep(Duration::from_millis(10));
    }
    println!("done");
    0
}

/// Keys by popularity: key `k` is drawn with probability ∝ 1/(k+1)^s.
pub(super) struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    pub(super) fn new(keys: u64, s: f64) -> Zipf {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (0..keys)
            .map(|k| {
                acc += 1.0 / ((k + 1) as f64).powf(s);
                acc
            })
            .collect();
        cdf.iter_mut().for_each(|c| *c /= acc);
        Zipf { cdf }
    }

    pub(super) fn sample(&self, x: &mut u64) -> u64 {
        let u = (next(x) >> 11) as f64 / (1u64 << 53) as f64;
        (self.cdf.partition_point(|&c| c < u) as u64).min(self.cdf.len() as u64 - 1)
    }
}

/// The number of keys whose values total `bytes`.
fn keys_for(bytes: u64) -> u64 {
    let (mut k, mut total) = (0u64, 0u64);
    while total < bytes {
        total += len_of(k) as u64;
        k += 1;
    }
    k
}

/// One second of the service: requests, hits, purged lookups (vrange-cache), wrong values,
/// refused inserts, and the bytes the cache held at its end.
#[derive(Default, Clone, Copy, Debug)]
struct Second {
    req: u64,
    hit: u64,
    purged: u64,
    wrong: u64,
    failed: u64,
    bytes: u64,
}

impl Second {
    fn add(&mut self, o: &Second) {
        self.req += o.req;
        self.hit += o.hit;
        self.purged += o.purged;
        self.wrong += o.wrong;
        self.failed += o.failed;
        self.bytes = self.bytes.max(o.bytes);
    }

    fn rate(&self) -> f64 {
        if self.req == 0 {
            0.0
        } else {
            self.hit as f64 / self.req as f64
        }
    }
}

/// `service PEER CAPACITY KEYS EPOCH_NS END_NS ZIPF`: answers requests from the epoch to the
/// end, printing `sec n= req= hit= purged= wrong= failed= bytes=` for every second.
pub(super) fn service_role(args: &[String]) -> i32 {
    let [peer, capacity, keys, epoch, end, zipf] = args else {
        eprintln!("usage: vrange-bench role cache service PEER CAPACITY KEYS EPOCH END ZIPF");
        return 2;
    };
    let (Ok(capacity), Ok(keys), Ok(epoch), Ok(end), Ok(zipf)) = (
        capacity.parse::<u64>(),
        keys.parse::<u64>(),
        epoch.parse::<u64>(),
        end.parse::<u64>(),
        zipf.parse::<f64>(),
    ) else {
        eprintln!("cache service role: bad numbers");
        return 2;
    };
    // The OOM killer's first choice, so that the neighbour is spared (lowering the
    // neighbour's score instead would need CAP_SYS_RESOURCE).
    let _ = vrange_testkit::hog::prefer_oom_kill();
    let zipf = Zipf::new(keys.max(1), zipf);
    let seed = u64::from(std::process::id()) | 1;
    match peer.as_str() {
        "vrange-cache" => serve(&Vr(Cache::new(Options::default())), &zipf, epoch, end, seed),
        "quick_cache" => serve(&Qc(quick(capacity, 34 << 10)), &zipf, epoch, end, seed),
        other => {
            eprintln!("cache service role: unknown peer {other}");
            2
        }
    }
}

fn serve(store: &impl Store, zipf: &Zipf, epoch: u64, end: u64, seed: u64) -> i32 {
    let now = now_ns();
    if now < epoch {
        std::thread::sleep(Duration::from_nanos(epoch - now));
    }
    let mut x = seed;
    let mut sec = now_ns().saturating_sub(epoch) / SEC;
    let mut c = Second::default();
    loop {
        for _ in 0..16 {
            let key = zipf.sample(&mut x);
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
            if !found && !store.regenerate(key, len) {
                c.failed += 1;
            }
        }
        let now = now_ns();
        let n = now.saturating_sub(epoch) / SEC;
        if n != sec || now >= end {
            c.bytes = store.bytes();
            println!(
                "sec n={sec} req={} hit={} purged={} wrong={} failed={} bytes={}",
                c.req, c.hit, c.purged, c.wrong, c.failed, c.bytes
            );
            (sec, c) = (n, Second::default());
        }
        if now >= end {
            break;
        }
    }
    println!("done");
    0
}

// ---------------------------------------------------------------------------------------
// The suite: the scenario.

struct Scenario {
    limit: u64,
    hog_peak: u64,
    warmup: Duration,
    period: Duration,
    tail: Duration,
    keys: u64,
}

impl Scenario {
    /// The suite's scenario: a 512 MiB cgroup, 10 s of warm-up, a 60 s ramp and a 5 s tail;
    /// `quick`: 128 MiB, 2 s, 15 s and 1 s.
    fn new(quick: bool) -> Scenario {
        let limit = if quick { 128 * MIB } else { 512 * MIB };
        Scenario {
            limit,
            hog_peak: limit * HOG_PERCENT / 100,
            warmup: Duration::from_secs(if quick { 2 } else { 10 }),
            period: Duration::from_secs(if quick { 15 } else { 60 }),
            tail: Duration::from_secs(if quick { 1 } else { 5 }),
            keys: keys_for(3 * limit),
        }
    }

    fn total(&self) -> Duration {
        self.warmup + self.period + self.tail
    }

    fn seconds(&self) -> usize {
        self.total().as_secs_f64().ceil() as usize
    }

    /// The hog's target at second `n` (its middle).
    fn hog_at(&self, t: f64) -> u64 {
        hog_target(
            self.hog_peak,
            self.warmup.as_millis() as u64,
            self.period.as_millis() as u64,
            (t.max(0.0) * 1e3) as u64,
        )
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

#[derive(Clone, Copy, Default)]
struct Sample {
    t: f64,
    usage: u64,
    hog: u64,
    service: u64,
}

struct Run {
    seconds: Vec<Second>,
    samples: Vec<Sample>,
    /// Seconds after the epoch at which the service was found killed.
    kills: Vec<f64>,
    starts: usize,
    oom_kills: Option<u64>,
    peak: Option<u64>,
    /// Seconds after the epoch at which the neighbour was found killed (and started again).
    hog_kills: Vec<f64>,
}

impl Run {
    fn take(&mut self, line: &str) {
        if !line.starts_with("sec ") {
            return;
        }
        let get = |k| field::<u64>(line, k).unwrap_or(0);
        let s = Second {
            req: get("req"),
            hit: get("hit"),
            purged: get("purged"),
            wrong: get("wrong"),
            failed: get("failed"),
            bytes: get("bytes"),
        };
        if let Some(slot) = self.seconds.get_mut(get("n") as usize) {
            slot.add(&s);
        }
    }

    fn total(&self) -> Second {
        let mut t = Second::default();
        self.seconds.iter().for_each(|s| t.add(s));
        t
    }

    /// The hit rate over the seconds whose middle `keep` accepts.
    fn rate_where(&self, keep: impl Fn(usize) -> bool) -> f64 {
        let mut t = Second::default();
        for (_, s) in self.seconds.iter().enumerate().filter(|(n, _)| keep(*n)) {
            t.add(s);
        }
        t.rate()
    }

    /// Mean of a sampled quantity over second `n`.
    fn mean_in(&self, n: usize, f: impl Fn(&Sample) -> u64) -> Option<f64> {
        let v: Vec<f64> = self
            .samples
            .iter()
            .filter(|s| s.t >= n as f64 && s.t < (n + 1) as f64)
            .map(|s| f(s) as f64)
            .collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    }
}

fn scenario_one(s: &Scenario, peer: &ScenarioPeer) -> Result<Run, String> {
    let cg = cgroup::try_child("vrange-bench-cache", s.limit)?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let spawn = |args: &[String]| -> Result<Proc, String> {
        let mut cmd = clean_command(&exe);
        cmd.args(["role", "cache"])
            .args(args)
            .env("VRANGE_STATS_DIR", "off");
        cgroup::join(&mut cmd, cg.cgroup())?;
        Proc::try_spawn(cmd)
    };
    let epoch = now_ns() + SEC / 2;
    let end = epoch + s.total().as_nanos() as u64;
    let hog_args: Vec<String> = vec![
        "hog".into(),
        s.hog_peak.to_string(),
        epoch.to_string(),
        s.warmup.as_millis().to_string(),
        s.period.as_millis().to_string(),
        end.to_string(),
    ];
    let mut hog = spawn(&hog_args)?;
    if hog
        .line("ready", Instant::now() + Duration::from_secs(10))
        .is_none()
    {
        let exit = hog.wait(Duration::from_secs(1));
        return Err(format!("the hog did not start ({exit}): {}", hog.stderr()));
    }
    let service_args: Vec<String> = vec![
        "service".into(),
        peer.store.into(),
        peer.capacity.to_string(),
        s.keys.to_string(),
        epoch.to_string(),
        end.to_string(),
        ZIPF.to_string(),
    ];
    let mut run = Run {
        seconds: vec![Second::default(); s.seconds()],
        samples: Vec::new(),
        kills: Vec::new(),
        starts: 1,
        oom_kills: None,
        peak: None,
        hog_kills: Vec::new(),
    };
    let mut service = Some(spawn(&service_args)?);
    let mut restart_at: Option<u64> = None;
    let mut next_sample = 0u64;
    let since = |now: u64| (now as f64 - epoch as f64) / 1e9;
    loop {
        let now = now_ns();
        if let Some(p) = service.as_mut() {
            while let Some(line) = p.line("", Instant::now()) {
                run.take(&line);
            }
            if let Some(exit) = p.ended() {
                while let Some(line) = p.line("", Instant::now() + Duration::from_millis(200)) {
                    run.take(&line);
                }
                if now < end && exit == Exit::Signal(libc::SIGKILL) {
                    run.kills.push(since(now));
                    let at = now + RESTART.as_nanos() as u64;
                    restart_at = (at + SEC < end).then_some(at);
                } else if exit != Exit::Code(0) || now < end {
                    return Err(format!(
                        "{}: the service ended: {exit}: {}",
                        peer.label,
                        p.stderr().trim()
                    ));
                }
                service = None;
            }
        }
        if service.is_none() {
            match restart_at {
                Some(at) if now >= at => {
                    service = Some(spawn(&service_args)?);
                    run.starts += 1;
                    restart_at = None;
                }
                None if now >= end => break,
                _ => {}
            }
        }
        if now > end + 20 * SEC {
            return Err(format!("{}: the service did not end", peer.label));
        }
        if now < end {
            // A neighbour killed with the service (its memory follows the epoch: a new one
            // takes the ramp up where it was).
            match hog.ended() {
                Some(Exit::Signal(libc::SIGKILL)) => {
                    run.hog_kills.push(since(now));
                    hog = spawn(&hog_args)?;
                }
                Some(e) => {
                    return Err(format!(
                        "{}: the hog ended: {e}: {}",
                        peer.label,
                        hog.stderr()
                    ))
                }
                None => {}
            }
        }
        if now >= next_sample && now >= epoch && now < end {
            next_sample = now + SEC / 10;
            run.samples.push(Sample {
                t: since(now),
                usage: cg.cgroup().usage().unwrap_or(0),
                hog: procfs::rss_lazy_kb(hog.pid()).0 * 1024,
                service: service
                    .as_ref()
                    .map_or(0, |p| procfs::rss_lazy_kb(p.pid()).0 * 1024),
            });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    hog.wait(Duration::from_secs(10));
    run.oom_kills = cg.cgroup().oom_kills().ok();
    run.peak = cgroup::peak(cg.cgroup());
    drop(hog);
    drop(cg);
    Ok(run)
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
    let run = scenario_one(&Scenario::new(quick), &ScenarioPeer::vrange_cache())?;
    let total = run.total();
    Ok(VrangeCacheRun {
        oom_kills: run.oom_kills,
        service_kills: run.kills.len(),
        neighbour_kills: run.hog_kills.len(),
        hit_rate: total.rate(),
        wrong: total.wrong,
    })
}

fn mib(b: u64) -> String {
    format!("{} MiB", b / MIB)
}

fn pct(x: f64) -> String {
    format!("{:.1} %", x * 100.0)
}

pub(super) fn scenario(ctx: &Ctx) -> Result<(), String> {
    if let Err(why) = cgroup::try_child("vrange-bench-probe", 64 << 20) {
        ctx.skipped("cache scenario", &why);
        return Ok(());
    }
    let s = Scenario::new(ctx.quick());
    let limit = s.limit;
    let slack = limit / 8;
    let full = limit - slack;
    let conservative = limit - s.hog_peak - slack;
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
         nothing for {} s, then ramps its resident memory 0 → {} ({HOG_PERCENT} % of the \
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
        s.warmup.as_secs(),
        mib(s.hog_peak),
        s.period.as_secs(),
        s.tail.as_secs(),
        RESTART.as_secs(),
        mib(slack),
        mib((limit / 16).clamp(4 * MIB, 256 * MIB)),
    ));
    let mut runs = Vec::new();
    for peer in &peers {
        progress(format!(
            "cache: scenario, {} ({} s)",
            peer.label,
            s.total().as_secs()
        ));
        runs.push(scenario_one(&s, peer)?);
    }
    let n = s.seconds();
    let high = |i: usize| s.hog_at(i as f64 + 0.5) >= s.hog_peak / 2;
    let mut table = Table::new(&[
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
    for (peer, run) in peers.iter().zip(&runs) {
        let t = run.total();
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
                    100.0 * s.hog_at(k) as f64 / limit as f64
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
            Some(k) if run.hog_kills.is_empty() => k.to_string(),
            Some(k) => format!(
                "{k} (neighbour {}: at {})",
                run.hog_kills.len(),
                run.hog_kills
                    .iter()
                    .map(|t| format!("{t:.1} s"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        table.row(vec![
            peer.label.clone(),
            report::rate(t.req as f64 / s.total().as_secs_f64()),
            pct(t.rate()),
            pct(run.rate_where(high)),
            pct(worst),
            run.seconds
                .iter()
                .filter(|x| x.req == 0)
                .count()
                .to_string(),
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
            peer.label.clone(),
            peer.capacity.to_string(),
            limit.to_string(),
            t.req.to_string(),
            t.hit.to_string(),
            format!("{:.4}", t.rate()),
            format!("{:.4}", run.rate_where(high)),
            format!("{worst:.4}"),
            run.seconds
                .iter()
                .filter(|x| x.req == 0)
                .count()
                .to_string(),
            run.oom_kills.map_or(String::new(), |k| k.to_string()),
            run.kills
                .iter()
                .map(|k| format!("{k:.1}"))
                .collect::<Vec<_>>()
                .join(" "),
            run.hog_kills
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
            let mean = |f: fn(&Sample) -> u64| report::opt(run.mean_in(i, f), 0);
            seconds_csv.row([
                peer.label.clone(),
                i.to_string(),
                sec.req.to_string(),
                sec.hit.to_string(),
                format!("{:.4}", sec.rate()),
                sec.purged.to_string(),
                sec.bytes.to_string(),
                s.hog_at(i as f64 + 0.5).to_string(),
                mean(|x| x.hog),
                mean(|x| x.service),
                mean(|x| x.usage),
            ]);
        }
        series.push(Series::new(
            peer.short.clone(),
            run.seconds
                .iter()
                .enumerate()
                .map(|(i, sec)| (i as f64 + 0.5, 100.0 * sec.rate()))
                .collect(),
        ));
    }
    ctx.table(&table);
    // The targets, second by second.
    let (vr, cons) = (&runs[0], &runs[1]);
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
    let mut targets = Table::new(&["target", "result"]);
    let vr_kills = vr
        .oom_kills
        .unwrap_or(0)
        .max((vr.kills.len() + vr.hog_kills.len()) as u64);
    targets.row(vec![
        "no OOM kill for vrange-cache".into(),
        if vr_kills == 0 {
            "met: 0 OOM kills".into()
        } else {
            format!("MISSED: {vr_kills} kills")
        },
    ]);
    targets.row(vec![
        "vrange-cache's hit rate ≥ the conservative peer's, every second".into(),
        match worst {
            None => format!("met: {n} of {n} seconds"),
            Some((i, d)) => format!(
                "MISSED in {} of {n} seconds (the hog at {:.0} % of the limit or more); worst: \
                 second {i}, {:.1} points below ({} vs {}; hog at {:.0} % of the limit)",
                deficits.len(),
                deficits
                    .iter()
                    .map(|&(i, _)| 100.0 * s.hog_at(i as f64 + 0.5) as f64 / limit as f64)
                    .fold(f64::MAX, f64::min),
                -d * 100.0,
                pct(vr.seconds[i].rate()),
                pct(cons.seconds[i].rate()),
                100.0 * s.hog_at(i as f64 + 0.5) as f64 / limit as f64
            ),
        },
    ]);
    targets.row(vec![
        "wrong values (every peer)".into(),
        if wrong == 0 {
            "met: 0".into()
        } else {
            format!("FAILED: {wrong}")
        },
    ]);
    ctx.table(&targets);
    // The hog, as measured during the first run, in percent of the limit.
    series.push(Series::new(
        "neighbour (% of limit)",
        (0..n)
            .filter_map(|i| {
                let m = runs[0].mean_in(i, |x| x.hog)?;
                Some((i as f64 + 0.5, 100.0 * m / limit as f64))
            })
            .collect(),
    ));
    csv.write(&ctx.out, "cache-scenario.csv")?;
    seconds_csv.write(&ctx.out, "cache-seconds.csv")?;
    let svg = plot::lines(
        &ctx.figure(format!(
            "Cache hit rate while a neighbour takes up to {HOG_PERCENT} % of a {} cgroup",
            mib(limit)
        )),
        &Axis::linear("time (s)", Unit::Plain),
        &Axis::linear(
            "hit rate (%), neighbour memory (% of the limit)",
            Unit::Plain,
        ),
        &series,
    );
    report::write_file(&ctx.out, "cache.svg", &svg)?;
    if wrong > 0 {
        return Err(format!("{wrong} wrong values read from the caches"));
    }
    Ok(())
}
