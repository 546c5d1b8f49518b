//! `vrange-bench proactive`: memory back before anyone asks. One memory cgroup runs the cache
//! scenario's service (vrange-cache, no capacity; vrange-malloc preloaded) at a steady load, its popular keys drifting
//! (new content replacing old), for the same time, a coordinator beside it: (a) nothing
//! proactive; (b) a senpai-style controller (Meta's TMO) that lowers the cgroup's ceiling while
//! its memory stall stays under the target and raises it when the stall rises, through the
//! kernel's interfaces alone (v2 `memory.high` and `memory.reclaim`; v1, which has neither,
//! `memory.limit_in_bytes`), beside the same service on a plain cache (quick_cache sized for
//! the container: no vrange at all), and (b′) beside the vrange service; (c) the coordinator's
//! proactive mode (`vrange daemon --proactive`). Reports the memory the cgroup holds second by
//! second, requests/s, hit rate, PSI and OOM kills, and plots the memory.

use super::cache::{keys_for, ZIPF};
use super::coordinator::InProcess;
use super::neighbour::{Neighbour, Ramp};
use super::plot::{Axis, Series, Unit};
use super::report::{self, mib, pct, progress, Csv, Table};
use super::service::{supervise, wrong_row, Samples, Seconds, MIB, SEC};
use super::Ctx;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use vrange_coordinator::{Options, Proactive, Scope};
use vrange_sys::cgroup::{MemCgroup, Version};
use vrange_sys::clock::now_ns;
use vrange_sys::pressure::PsiReading;
use vrange_testkit::cgroup;
use vrange_testkit::proc::{clean_command, Proc};

/// The stall target of (b) and (c): PSI `some`, percent (the and the mode's default).
const STALL_PCT: f64 = 0.1;

/// The three ways the same service runs.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Nothing,
    /// Senpai beside the service on a plain cache: no vrange.
    Senpai,
    /// Senpai beside the vrange service.
    SenpaiVrange,
    Vrange,
}

impl Mode {
    const ALL: [Mode; 4] = [
        Mode::Nothing,
        Mode::Senpai,
        Mode::SenpaiVrange,
        Mode::Vrange,
    ];

    fn label(self) -> &'static str {
        match self {
            Mode::Nothing => "(a) nothing proactive",
            Mode::Senpai => "(b) senpai-style, plain cache (no vrange)",
            Mode::SenpaiVrange => "(b′) senpai-style beside vrange-cache",
            Mode::Vrange => "(c) vrange daemon --proactive",
        }
    }

    fn short(self) -> &'static str {
        match self {
            Mode::Nothing => "(a) nothing",
            Mode::Senpai => "(b) senpai, plain cache",
            Mode::SenpaiVrange => "(b′) senpai, vrange-cache",
            Mode::Vrange => "(c) vrange proactive",
        }
    }

    fn senpai(self) -> bool {
        matches!(self, Mode::Senpai | Mode::SenpaiVrange)
    }
}

/// The scenario's numbers.
struct Setup {
    limit: u64,
    /// Keys in the popular window, and how fast it moves (keys per second).
    keys: u64,
    drift: u64,
    /// Requests per second offered.
    rate: u64,
    seconds: u64,
    /// The proactive mode's age.
    age: Duration,
}

impl Setup {
    /// 512 MiB, 5 minutes, a window of 128 MiB of values moving by itself every 60 s, 3000
    /// requests/s, the mode's default age (30 s); `quick`: 128 MiB, 30 s, 32 MiB every 10 s,
    /// 1000 requests/s, 5 s.
    fn new(quick: bool) -> Setup {
        let (limit, window, period, rate, seconds, age) = if quick {
            (128 * MIB, 32 * MIB, 10, 1000, 30, 5)
        } else {
            (512 * MIB, 128 * MIB, 60, 3000, 300, 30)
        };
        let keys = keys_for(window);
        Setup {
            limit,
            keys,
            drift: keys.div_ceil(period),
            rate,
            seconds,
            age: Duration::from_secs(age),
        }
    }
}

/// One second's stall, as the stall file read at its end.
#[derive(Clone, Copy, Default)]
struct Stall {
    some: f64,
    full: f64,
}

struct Run {
    seconds: Seconds,
    samples: Samples,
    stalls: Vec<Stall>,
    /// The ceiling (b) set, or the target (c) aimed for, each second (0: none).
    targets: Vec<u64>,
    kills: usize,
    oom_kills: Option<u64>,
    /// What (c) did by its own count: bytes freed by its steps, steps, looks that held.
    saved: u64,
    steps: u64,
    holds: u64,
}

impl Run {
    /// Mean cgroup usage over the run's seconds (bytes).
    fn mean_usage(&self) -> f64 {
        let v: Vec<f64> = self.samples.0.iter().map(|s| s.usage as f64).collect();
        v.iter().sum::<f64>() / v.len().max(1) as f64
    }

    fn requests_per_s(&self, seconds: u64) -> f64 {
        self.seconds.total().req as f64 / seconds as f64
    }

    /// Seconds whose `some` stall was at most the target, of those read.
    fn quiet_share(&self) -> f64 {
        let n = self.stalls.len().max(1) as f64;
        self.stalls.iter().filter(|s| s.some <= STALL_PCT).count() as f64 / n
    }
}

/// The senpai-style controller of (b): every second, lowers its target by 1 % of the usage
/// while the stall is at most the target (never under an eighth of the limit), and raises it
/// by the stall's excess (up to 10 % of the limit per second, never above the limit) when it
/// is above. v2: the target is `memory.high`, with a `memory.reclaim` of the step. v1 has
/// neither: the hard limit is set to the target, so that the kernel reclaims down to it (or
/// refuses, EBUSY, what it cannot reclaim), and put back at once: what `memory.reclaim` does.
/// A hard limit left at the target would have the kernel OOM-kill the service at its next
/// growth instead of throttling it (a first version that did so killed it 28 times in 30 s).
fn senpai(cg: &MemCgroup, limit: u64, stop: &AtomicBool, targets: &Mutex<Vec<u64>>) {
    let file = vrange_sys::pressure::stall_file(Some(cg));
    let mut ceiling = limit;
    let mut last: Option<(Instant, PsiReading)> = None;
    while !stop.load(Relaxed) {
        std::thread::sleep(Duration::from_secs(1));
        let now = Instant::now();
        let reading = file.as_deref().and_then(|f| PsiReading::read(f).ok());
        let stall = match (reading, last) {
            (Some(r), Some((then, before))) => Some(
                r.some_pct_since(&before, now.duration_since(then))
                    .max(r.some_avg10),
            ),
            _ => None,
        };
        last = reading.map(|r| (now, r));
        let usage = cg.usage().unwrap_or(ceiling);
        let want = match stall {
            Some(s) if s > STALL_PCT => {
                let up = ((s / STALL_PCT - 1.0) * 0.01).min(0.1);
                ceiling
                    .saturating_add((limit as f64 * up) as u64)
                    .min(limit)
            }
            _ => usage
                .min(ceiling)
                .saturating_sub(usage / 100)
                .max(limit / 8),
        };
        let set = match cg.version() {
            Version::V2 => {
                let r = std::fs::write(cg.file("memory.high"), want.to_string());
                if want < ceiling {
                    let _ = cg.reclaim(ceiling - want);
                }
                r
            }
            Version::V1 => {
                let file = cg.file("memory.limit_in_bytes");
                let r = std::fs::write(&file, want.to_string());
                if r.is_ok() {
                    // The kernel reclaimed down to it: the limit goes back at once.
                    std::fs::write(&file, limit.to_string())
                        .map_err(|e| format!("put the limit back: {e}"))
                        .expect("the bench's own cgroup");
                }
                // What could not be reclaimed (EBUSY) is still the target.
                Ok(())
            }
        };
        if set.is_ok() {
            ceiling = want;
        }
        targets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ceiling);
    }
}

/// The threshold of vrange-malloc in the vrange service: the values' buffers (4 to 64 KiB,
/// regenerated at each miss, copied into the cache and freed) are its blocks.
const MALLOC_THRESHOLD: &str = "16K";

/// One configuration's run; `shim` is vrange-malloc's, preloaded into the vrange service.
fn one(s: &Setup, mode: Mode, shim: &std::path::Path) -> Result<Run, String> {
    let child = cgroup::try_child("vrange-bench-proactive", s.limit)?;
    let cg = child.cgroup().clone();
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let dir = tempfile::Builder::new()
        .prefix("vrange-bench-proactive")
        .tempdir()
        .map_err(|e| format!("temporary directory: {e}"))?;
    let socket: PathBuf = dir.path().join("coordinator.sock");
    let mut coordinator = InProcess::start(Options {
        socket: socket.clone(),
        scope: Scope::Cgroup(cg.path().to_path_buf()),
        proactive: (mode == Mode::Vrange).then_some(Proactive {
            min_idle: s.age,
            stall_pct: STALL_PCT,
            ..Proactive::default()
        }),
        ..Options::default()
    })?;
    let command = |args: &[String]| -> Result<std::process::Command, String> {
        let mut cmd = clean_command(&exe);
        cmd.arg("role")
            .args(args)
            .env("VRANGE_STATS_DIR", "off")
            .env("VRANGE_COORDINATOR", &socket);
        cgroup::join(&mut cmd, &cg)?;
        Ok(cmd)
    };
    let spawn = |args: &[String]| Proc::try_spawn(command(args)?);
    // The vrange service runs on vrange-malloc too; the plain one on glibc alone.
    let spawn_service = |args: &[String]| {
        let mut cmd = command(args)?;
        if mode != Mode::Senpai {
            cmd.env("LD_PRELOAD", shim)
                .env("VRANGE_MALLOC_THRESHOLD", MALLOC_THRESHOLD);
        }
        Proc::try_spawn(cmd)
    };
    let epoch = now_ns() + SEC / 2;
    let end = epoch + s.seconds * SEC;
    // No neighbour: one that holds nothing, for the supervisor.
    let idle = Ramp {
        peak: 0,
        warmup: Duration::from_secs(s.seconds),
        period: Duration::from_secs(1),
        tail: Duration::ZERO,
    };
    let neighbour = Neighbour::start(spawn, idle.role_args(epoch, end))?;
    // The plain cache is sized for the container: the limit less an eighth for the process
    // (as the cache suite's "sized for the container" peer).
    let (store, capacity) = match mode {
        Mode::Senpai => ("quick_cache", s.limit - s.limit / 8),
        _ => ("vrange-cache", 0),
    };
    let service_args: Vec<String> = [
        "cache".to_string(),
        "service".into(),
        store.into(),
        capacity.to_string(),
        s.keys.to_string(),
        epoch.to_string(),
        end.to_string(),
        ZIPF.to_string(),
        s.rate.to_string(),
        s.drift.to_string(),
    ]
    .into();
    let stop = AtomicBool::new(false);
    let targets = Mutex::new(Vec::new());
    let stalls = Mutex::new(Vec::new());
    let mut seconds = Seconds::new(s.seconds as usize);
    let seen = std::thread::scope(|scope| {
        if mode.senpai() {
            scope.spawn(|| senpai(&cg, s.limit, &stop, &targets));
        }
        scope.spawn(|| {
            let file = vrange_sys::pressure::stall_file(Some(&cg));
            crate::service::sleep_until(epoch);
            let mut n = 1;
            while !stop.load(Relaxed) && n <= s.seconds {
                crate::service::sleep_until(epoch + n * SEC);
                n += 1;
                let r = file.as_deref().and_then(|f| PsiReading::read(f).ok());
                stalls
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(Stall {
                        some: r.map_or(0.0, |r| r.some_avg10),
                        full: r.map_or(0.0, |r| r.full_avg10),
                    });
                if mode == Mode::Vrange {
                    let target = coordinator
                        .metric("vrange_proactive_target_bytes")
                        .unwrap_or(0.0);
                    targets
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(target as u64);
                }
            }
        });
        let seen = supervise(
            mode.label(),
            &cg,
            (epoch, end),
            neighbour,
            spawn,
            || spawn_service(&service_args),
            |line| {
                seconds.take(line);
            },
        );
        stop.store(true, Relaxed);
        seen
    })?;
    let metric = |name| coordinator.metric(name).unwrap_or(0.0) as u64;
    let (saved, steps, holds) = (
        metric("vrange_proactive_saved_bytes_total"),
        metric("vrange_proactive_steps_total"),
        metric("vrange_proactive_stalls_total"),
    );
    coordinator.stop();
    let oom_kills = cg.oom_kills().ok();
    drop(child);
    Ok(Run {
        seconds,
        samples: seen.samples,
        stalls: stalls.into_inner().unwrap_or_else(|e| e.into_inner()),
        targets: targets.into_inner().unwrap_or_else(|e| e.into_inner()),
        kills: seen.kills.len(),
        oom_kills,
        saved,
        steps,
        holds,
    })
}

pub fn run(ctx: &Ctx) -> Result<(), String> {
    if !ctx.memory_cgroups("proactive") {
        return Ok(());
    }
    let s = Setup::new(ctx.quick());
    let shim = ctx.lib()?;
    ctx.say(format!(
        "Scenario: the cache suite's service (vrange-cache, no capacity; a hit checks every \
         byte, a miss regenerates the value and inserts it; vrange-malloc preloaded with a \
         threshold of {MALLOC_THRESHOLD}, so that the values' buffers are its blocks) alone \
         in a memory cgroup of {} (no \
         swap), {} requests/s offered for {} s, keys drawn from a Zipf law (s = {ZIPF}) over a \
         window of {} keys ({} of values) that moves on by {} keys a second (popular content \
         replaced by new: a window's worth every {} s). A coordinator runs beside it each \
         time. (a) nothing more; (b) a senpai-style controller: every second, the ceiling 1 % \
         of the usage lower while PSI some stays at most {STALL_PCT} %, raised when above \
         (v1: memory.limit_in_bytes; v2: memory.high and memory.reclaim), beside the same \
         service on quick_cache sized for the container (no vrange at all); (b′) the same \
         controller beside the vrange service; (c) the \
         coordinator's proactive mode (stall target {STALL_PCT} %, age {} s, steps of 1 %). \
         The stall is the cgroup's memory.pressure on v2, the machine's on v1 (cgroup v1 \
         has none of its own).",
        mib(s.limit),
        s.rate,
        s.seconds,
        s.keys,
        mib(super::cache::values_bytes(s.keys)),
        s.drift,
        s.keys / s.drift.max(1),
        s.age.as_secs(),
    ));
    let mut runs = Vec::new();
    for mode in Mode::ALL {
        progress(format!("proactive: {} ({} s)", mode.label(), s.seconds));
        runs.push(one(&s, mode, &shim)?);
    }
    let base = runs[0].mean_usage();
    let mut table = Table::new(&[
        "configuration",
        "mean memory",
        "less than (a)",
        "requests/s",
        "vs (a)",
        "hit rate",
        "seconds with PSI some ≤ 0.1 %",
        "PSI some avg10, max",
        "PSI full avg10, max",
        "OOM kills",
        "wrong values",
    ]);
    let mut csv = Csv::new(&[
        "configuration",
        "second",
        "requests",
        "hits",
        "cgroup_usage_bytes",
        "target_bytes",
        "psi_some_avg10",
        "psi_full_avg10",
    ]);
    let mut series = Vec::new();
    let mut wrong = 0;
    for (mode, run) in Mode::ALL.iter().zip(&runs) {
        let t = run.seconds.total();
        wrong += t.wrong;
        let max = |f: fn(&Stall) -> f64| run.stalls.iter().map(f).fold(0.0, f64::max);
        table.row(vec![
            mode.label().into(),
            mib(run.mean_usage() as u64),
            pct(1.0 - run.mean_usage() / base),
            report::rate(run.requests_per_s(s.seconds)),
            format!(
                "{:.3}×",
                run.requests_per_s(s.seconds) / runs[0].requests_per_s(s.seconds)
            ),
            pct(t.rate()),
            pct(run.quiet_share()),
            format!("{:.2} %", max(|x| x.some)),
            format!("{:.2} %", max(|x| x.full)),
            match run.oom_kills {
                Some(k) => k.max(run.kills as u64).to_string(),
                None => "?".into(),
            },
            t.wrong.to_string(),
        ]);
        for (i, sec) in run.seconds.iter().enumerate() {
            let st = run.stalls.get(i).copied().unwrap_or_default();
            csv.row([
                mode.label().to_string(),
                i.to_string(),
                sec.req.to_string(),
                sec.hit.to_string(),
                report::opt(run.samples.mean_in(i, |x| x.usage), 0),
                run.targets.get(i).copied().unwrap_or(0).to_string(),
                format!("{:.2}", st.some),
                format!("{:.2}", st.full),
            ]);
        }
        series.push(Series::new(
            mode.short(),
            (0..s.seconds as usize)
                .filter_map(|i| {
                    let m = run.samples.mean_in(i, |x| x.usage)?;
                    Some((i as f64 + 0.5, m / MIB as f64))
                })
                .collect(),
        ));
    }
    ctx.table(&table);
    let (a, b, b2, c) = (&runs[0], &runs[1], &runs[2], &runs[3]);
    let saved = |r: &Run| base - r.mean_usage();
    let mut targets = Table::new(&["target", "result"]);
    let met = |ok: bool| if ok { "met" } else { "MISSED" };
    let less = 1.0 - c.mean_usage() / base;
    targets.row(vec![
        "(c) holds ≥ 20 % less memory than (a), on average".into(),
        format!("{}: {} less", met(less >= 0.2), pct(less)),
    ]);
    let ratio = c.requests_per_s(s.seconds) / a.requests_per_s(s.seconds);
    targets.row(vec![
        "(c) requests/s ≥ 0.98× (a)'s".into(),
        format!("{}: {ratio:.3}×", met(ratio >= 0.98)),
    ]);
    targets.row(vec![
        format!("(c) PSI some avg10 ≤ {STALL_PCT} % in ≥ 95 % of seconds"),
        format!("{}: {}", met(c.quiet_share() >= 0.95), pct(c.quiet_share())),
    ]);
    let vs = saved(c) / saved(b).max(1.0);
    targets.row(vec![
        "(c) saves ≥ 1.5× what (b) saves".into(),
        format!(
            "{}: {} against {} ({vs:.2}×)",
            met(saved(c) >= 1.5 * saved(b)),
            mib(saved(c).max(0.0) as u64),
            mib(saved(b).max(0.0) as u64)
        ),
    ]);
    let kills: u64 = runs
        .iter()
        .map(|r| r.oom_kills.unwrap_or(0).max(r.kills as u64))
        .sum();
    targets.row(vec![
        "0 OOM kills (every configuration)".into(),
        format!("{}: {kills}", met(kills == 0)),
    ]);
    targets.row(wrong_row("values", wrong));
    ctx.table(&targets);
    ctx.say(format!(
        "(b′) beside vrange-cache, the same controller's reclaims take vrange's volatile \
         memory too (the kernel frees the ranges armed for it; the reclaimer purges under a \
         ceiling lowered): it saves {} ({} less than (a)) at a hit rate of {} against (a)'s {} \
         and (c)'s {}. Its stall signal does not see the hits lost: purged volatile memory \
         costs misses, not memory stalls; (c) holds on refaults.",
        mib(saved(b2).max(0.0) as u64),
        pct(1.0 - b2.mean_usage() / base),
        pct(b2.seconds.total().rate()),
        pct(a.seconds.total().rate()),
        pct(c.seconds.total().rate()),
    ));
    ctx.say(format!(
        "(c) freed {} by its own count in {} steps (cold volatile memory purged before any \
         pressure); {} of its looks held for a stall, pressure or refaults.",
        mib(c.saved),
        c.steps,
        c.holds
    ));
    csv.write(&ctx.out, "proactive-seconds.csv")?;
    let svg = super::plot::lines(
        &ctx.figure(format!(
            "Memory held by a {} cgroup: nothing proactive, senpai-style, vrange's proactive mode",
            mib(s.limit)
        )),
        &Axis::linear("time (s)", Unit::Plain),
        &Axis::linear("cgroup memory (MiB)", Unit::Plain),
        &series,
    );
    report::write_file(&ctx.out, "proactive.svg", &svg)?;
    if wrong > 0 {
        return Err(format!("{wrong} wrong values read"));
    }
    Ok(())
}
