//! One configuration of the coordinate suite: the cgroup, the processes, the samples.

use super::roles::*;
use super::*;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Config {
    PerProcess,
    Coordinator,
    Kill,
}

impl Config {
    pub(super) const ALL: [Config; 3] = [Config::PerProcess, Config::Coordinator, Config::Kill];

    pub(super) fn label(self) -> &'static str {
        match self {
            Config::PerProcess => "per-process reclaimers",
            Config::Coordinator => "coordinator",
            Config::Kill => "kill-based (kernel OOM killer)",
        }
    }

    pub(super) fn short(self) -> &'static str {
        match self {
            Config::PerProcess => "per-process",
            Config::Coordinator => "coordinator",
            Config::Kill => "kill-based",
        }
    }

    pub(super) fn mode(self) -> &'static str {
        match self {
            Config::Kill => "plain",
            _ => "volatile",
        }
    }
}

pub(super) struct Scenario {
    pub(super) limit: u64,
    pub(super) chunks: usize,
    pub(super) peak: u64,
    pub(super) warmup: Duration,
    pub(super) period: Duration,
    pub(super) tail: Duration,
}

impl Scenario {
    pub(super) fn total(&self) -> Duration {
        self.warmup + self.period + self.tail
    }

    pub(super) fn seconds(&self) -> usize {
        self.total().as_secs_f64().ceil() as usize
    }

    /// The neighbour's target `t` seconds after the epoch.
    pub(super) fn neighbour_at(&self, t: f64) -> u64 {
        neighbour_target(
            self.peak,
            self.warmup.as_millis() as u64,
            self.period.as_millis() as u64,
            (t.max(0.0) * 1e3) as u64,
        )
    }

    /// The headroom threshold of the reclaimers and of the coordinator (`auto`).
    pub(super) fn threshold(&self) -> u64 {
        (self.limit / 16).clamp(4 * MIB, 256 * MIB)
    }
}

#[derive(Clone, Copy, Default)]
pub(super) struct Sample {
    pub(super) t: f64,
    pub(super) usage: u64,
    pub(super) neighbour: u64,
}

/// One configuration's run.
#[derive(Default)]
pub(super) struct Run {
    /// Per second, every participant summed.
    pub(super) seconds: Vec<Second>,
    /// Per participant, the whole run.
    pub(super) per: Vec<Second>,
    /// Chunks found purged: participant, seconds after the epoch, age (ms).
    pub(super) purges: Vec<(usize, f64, u64)>,
    /// The participants' reclaimers' reaction times (ns), one per purging event.
    pub(super) reactions: Vec<f64>,
    /// Their purging events by source.
    pub(super) sources: std::collections::BTreeMap<String, u64>,
    /// The coordinator's pressure events by source.
    pub(super) coordinator_events: Vec<(&'static str, u64)>,
    /// The coordinator's rounds: pressure seen to the last answer (ns).
    pub(super) rounds: Vec<f64>,
    /// Pressure episodes (s): the headroom under the threshold until it is back above.
    pub(super) episodes: Vec<f64>,
    /// An episode still open at the end (s).
    pub(super) open_episode: Option<f64>,
    /// Participants killed: which, seconds after the epoch.
    pub(super) kills: Vec<(usize, f64)>,
    /// Participant-seconds without service after a kill.
    pub(super) down: f64,
    /// Requests that arrived while a participant was down (its rate × its downtime).
    pub(super) unserved: f64,
    /// The same per second after the epoch.
    pub(super) unserved_seconds: Vec<f64>,
    pub(super) neighbour_kills: Vec<f64>,
    pub(super) oom_kills: Option<u64>,
    pub(super) peak: Option<u64>,
    pub(super) samples: Vec<Sample>,
    /// Summed over the participants' `end` lines.
    pub(super) connections: u64,
    pub(super) obeyed: u64,
    pub(super) deferred: u64,
    /// Participants whose `end` line said they never connected to a coordinator.
    pub(super) never_connected: usize,
    /// The coordinator's counters at the end: rounds, requests, bytes freed.
    pub(super) coordinator: Option<(u64, u64, u64)>,
}

impl Run {
    /// A participant serving `rate` requests a second was down from `from` to `to` (seconds
    /// after the epoch).
    pub(super) fn add_down(&mut self, from: f64, to: f64, rate: f64) {
        self.down += to - from;
        self.unserved += (to - from) * rate;
        let mut t = from;
        while t < to {
            let sec = t.floor();
            let upto = (sec + 1.0).min(to);
            let i = sec as usize;
            if self.unserved_seconds.len() <= i {
                self.unserved_seconds.resize(i + 1, 0.0);
            }
            self.unserved_seconds[i] += (upto - t) * rate;
            t = upto;
        }
    }

    pub(super) fn take(&mut self, p: usize, line: &str, t: f64) {
        let get = |k| field::<u64>(line, k).unwrap_or(0);
        if line.starts_with("sec ") {
            let s = Second {
                req: get("req"),
                hit: get("hit"),
                miss: get("miss"),
                wrong: get("wrong"),
                purged: get("purged"),
            };
            if let Some(slot) = self.seconds.get_mut(get("n") as usize) {
                slot.add(&s);
            }
            self.per[p].add(&s);
        } else if line.starts_with("purge ") {
            self.purges.push((p, t, get("age_ms")));
        } else if line.starts_with("reaction ") {
            let (ns, n) = (get("ns"), get("n").max(1));
            if let Some(src) = field::<String>(line, "source") {
                *self.sources.entry(src).or_default() += n;
            }
            self.reactions
                .extend(std::iter::repeat_n(ns as f64, n as usize));
        } else if line.starts_with("end ") {
            self.connections += get("connections");
            self.obeyed += get("requests");
            self.deferred += get("deferred");
            self.never_connected += usize::from(get("connections") == 0);
        }
    }

    pub(super) fn total(&self) -> Second {
        let mut t = Second::default();
        self.seconds.iter().for_each(|s| t.add(s));
        t
    }

    pub(super) fn rate_where(&self, keep: impl Fn(usize) -> bool) -> f64 {
        let mut t = Second::default();
        for (_, s) in self.seconds.iter().enumerate().filter(|(n, _)| keep(*n)) {
            t.add(s);
        }
        t.rate()
    }

    pub(super) fn mean_in(&self, n: usize, f: impl Fn(&Sample) -> u64) -> Option<f64> {
        let v: Vec<f64> = self
            .samples
            .iter()
            .filter(|s| s.t >= n as f64 && s.t < (n + 1) as f64)
            .map(|s| f(s) as f64)
            .collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    }

    pub(super) fn youngest_purged(&self) -> Option<u64> {
        self.purges.iter().map(|p| p.2).min()
    }

    pub(super) fn median_age(&self) -> Option<f64> {
        report::median(&mut self.purges.iter().map(|p| p.2 as f64).collect::<Vec<_>>())
    }

    /// The youngest age purged in second `n` (ms).
    pub(super) fn youngest_in(&self, n: usize) -> Option<u64> {
        self.purges
            .iter()
            .filter(|p| p.1 >= n as f64 && p.1 < (n + 1) as f64)
            .map(|p| p.2)
            .min()
    }
}

/// A coordinator in a thread of this process.
pub(super) struct InProcess {
    pub(super) shared: Arc<vrange_coordinator::Shared>,
    pub(super) thread: Option<std::thread::JoinHandle<std::io::Result<()>>>,
}

impl InProcess {
    /// Starts one on `socket` for cgroup `cgroup` (the daemon's defaults otherwise) and waits
    /// until it answers.
    pub(super) fn start(socket: &Path, cgroup: &Path) -> Result<InProcess, String> {
        let opts = vrange_coordinator::Options {
            socket: socket.to_path_buf(),
            scope: vrange_coordinator::Scope::Cgroup(cgroup.to_path_buf()),
            ..vrange_coordinator::Options::default()
        };
        let shared = Arc::new(vrange_coordinator::Shared::default());
        let s = shared.clone();
        let thread = std::thread::spawn(move || vrange_coordinator::run(&opts, &s));
        let mut c = InProcess {
            shared,
            thread: Some(thread),
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while vrange_coordinator::query(socket).is_err() {
            if c.thread.as_ref().is_some_and(|t| t.is_finished()) || Instant::now() > deadline {
                return Err(format!("the coordinator did not start: {}", c.stop()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(c)
    }

    /// A metric of the last snapshot.
    pub(super) fn metric(&self, name: &str) -> Option<f64> {
        let text = self.shared.metrics();
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
    }

    /// Stops it; says how it ended.
    pub(super) fn stop(&mut self) -> String {
        self.shared.stop.store(true, Relaxed);
        match self.thread.take().map(|t| t.join()) {
            Some(Ok(Ok(()))) | None => "stopped".into(),
            Some(Ok(Err(e))) => e.to_string(),
            Some(Err(_)) => "panicked".into(),
        }
    }
}

impl Drop for InProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One participant's process and supervisor state.
pub(super) struct Seat {
    pub(super) proc: Option<Proc>,
    pub(super) restart_at: Option<u64>,
    pub(super) down_since: Option<f64>,
}

pub(super) fn run_one(s: &Scenario, config: Config) -> Result<Run, String> {
    let cg = cgroup::try_child("vrange-bench-coord", s.limit)?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let dir = tempfile::Builder::new()
        .prefix("vrange-bench-coord")
        .tempdir()
        .map_err(|e| format!("temporary directory: {e}"))?;
    let socket: PathBuf = dir.path().join("coordinator.sock");
    let mut coordinator = match config {
        Config::Coordinator => Some(InProcess::start(&socket, cg.cgroup().path())?),
        _ => None,
    };
    let setting = match config {
        Config::Coordinator => socket.display().to_string(),
        _ => "off".to_string(),
    };
    let spawn = |role: &str, args: &[String]| -> Result<Proc, String> {
        let mut cmd = clean_command(&exe);
        cmd.args(["role", role])
            .args(args)
            .env("VRANGE_STATS_DIR", "off")
            .env("VRANGE_COORDINATOR", &setting);
        cgroup::join(&mut cmd, cg.cgroup())?;
        Proc::try_spawn(cmd)
    };
    let epoch = now_ns() + SEC / 2;
    let end = epoch + s.total().as_nanos() as u64;
    let neighbour_args: Vec<String> = vec![
        s.peak.to_string(),
        epoch.to_string(),
        s.warmup.as_millis().to_string(),
        s.period.as_millis().to_string(),
        end.to_string(),
    ];
    let mut neighbour = spawn("coordinate-neighbour", &neighbour_args)?;
    if neighbour
        .line("ready", Instant::now() + Duration::from_secs(10))
        .is_none()
    {
        let exit = neighbour.wait(Duration::from_secs(1));
        return Err(format!(
            "the neighbour did not start ({exit}): {}",
            neighbour.stderr()
        ));
    }
    let participant_args = |i: usize, fill_at: u64, prefill: bool| -> Vec<String> {
        vec![
            i.to_string(),
            s.chunks.to_string(),
            RATES[i].to_string(),
            epoch.to_string(),
            fill_at.to_string(),
            end.to_string(),
            config.mode().to_string(),
            u8::from(prefill).to_string(),
        ]
    };
    let mut run = Run {
        seconds: vec![Second::default(); s.seconds()],
        per: vec![Second::default(); RATES.len()],
        ..Run::default()
    };
    let mut seats = Vec::new();
    for i in 0..RATES.len() {
        let fill_at = epoch + i as u64 * STAGGER.as_nanos() as u64;
        seats.push(Seat {
            proc: Some(spawn(
                "coordinate-participant",
                &participant_args(i, fill_at, true),
            )?),
            restart_at: None,
            down_since: None,
        });
    }
    let since = |now: u64| (now as f64 - epoch as f64) / 1e9;
    let threshold = s.threshold();
    let mut pressure_since: Option<f64> = None;
    let mut last_response = 0.0f64;
    let mut next_sample = 0u64;
    loop {
        let now = now_ns();
        let t = since(now);
        for (i, seat) in seats.iter_mut().enumerate() {
            if let Some(p) = seat.proc.as_mut() {
                while let Some(line) = p.line("", Instant::now()) {
                    if line == "serving" {
                        if let Some(d) = seat.down_since.take() {
                            run.add_down(d, t, RATES[i] as f64);
                        }
                    }
                    run.take(i, &line, t);
                }
                if let Some(exit) = p.ended() {
                    while let Some(line) = p.line("", Instant::now() + Duration::from_millis(200)) {
                        run.take(i, &line, t);
                    }
                    if now < end && exit == Exit::Signal(libc::SIGKILL) {
                        run.kills.push((i, t));
                        seat.down_since = Some(t);
                        let at = now + RESTART.as_nanos() as u64;
                        seat.restart_at = (at + SEC < end).then_some(at);
                    } else if exit != Exit::Code(0) || now < end {
                        return Err(format!(
                            "{}: participant {i} ended: {exit}: {}",
                            config.label(),
                            p.stderr().trim()
                        ));
                    }
                    seat.proc = None;
                }
            }
            if seat.proc.is_none() && seat.restart_at.is_some_and(|at| now >= at) {
                seat.proc = Some(spawn(
                    "coordinate-participant",
                    &participant_args(i, now, false),
                )?);
                seat.restart_at = None;
            }
        }
        if seats
            .iter()
            .all(|x| x.proc.is_none() && x.restart_at.is_none())
            && now >= end
        {
            break;
        }
        if now > end + 20 * SEC {
            return Err(format!("{}: the participants did not end", config.label()));
        }
        if now < end {
            match neighbour.ended() {
                Some(Exit::Signal(libc::SIGKILL)) => {
                    run.neighbour_kills.push(t);
                    neighbour = spawn("coordinate-neighbour", &neighbour_args)?;
                }
                Some(e) => {
                    return Err(format!(
                        "{}: the neighbour ended: {e}: {}",
                        config.label(),
                        neighbour.stderr()
                    ))
                }
                None => {}
            }
        }
        if now >= epoch && now < end {
            // Pressure episodes, sampled every loop (10 ms).
            let usage = cg.cgroup().usage().unwrap_or(0);
            let low = s.limit.saturating_sub(usage) < threshold;
            match (low, pressure_since) {
                (true, None) => pressure_since = Some(t),
                (false, Some(from)) => {
                    run.episodes.push(t - from);
                    pressure_since = None;
                }
                _ => {}
            }
            if now >= next_sample {
                next_sample = now + SEC / 10;
                run.samples.push(Sample {
                    t,
                    usage,
                    neighbour: procfs::rss_lazy_kb(neighbour.pid()).0 * 1024,
                });
            }
        }
        if let Some(c) = &coordinator {
            if let Some(r) = c.metric("vrange_coordinator_last_response_seconds") {
                if r > 0.0 && r != last_response {
                    run.rounds.push(r * 1e9);
                    last_response = r;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    run.open_episode = pressure_since.map(|from| since(end) - from);
    for (i, seat) in seats.iter_mut().enumerate() {
        if let Some(d) = seat.down_since.take() {
            run.add_down(d, since(end), RATES[i] as f64);
        }
    }
    neighbour.wait(Duration::from_secs(10));
    run.oom_kills = cg.cgroup().oom_kills().ok();
    run.peak = cgroup::peak(cg.cgroup());
    if let Some(c) = coordinator.as_mut() {
        let get = |name| c.metric(name).unwrap_or(0.0) as u64;
        run.coordinator = Some((
            get("vrange_coordinator_rounds_total"),
            get("vrange_coordinator_requests_total"),
            get("vrange_coordinator_freed_bytes_total"),
        ));
        for src in ["psi", "vmpressure-medium", "vmpressure-critical"] {
            let name = format!("vrange_coordinator_pressure_events_total{{source=\"{src}\"}}");
            run.coordinator_events
                .push((src, c.metric(&name).unwrap_or(0.0) as u64));
        }
        let how = c.stop();
        if how != "stopped" {
            return Err(format!("the coordinator ended: {how}"));
        }
    }
    drop(coordinator);
    drop(seats);
    drop(neighbour);
    drop(cg);
    Ok(run)
}
