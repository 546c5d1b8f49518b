//! One configuration of the coordinate suite: the cgroup, the processes, the samples.

use super::*;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Config {
    PerProcess,
    Coordinator,
    /// The same caches in shared regions (a chunk: a range of one region per participant,
    /// mapped by a partner process too), each process's reclaimer purging them.
    SharedPerProcess,
    /// The same, the coordinator purging the shared regions itself, in the global order.
    SharedCoordinator,
    Kill,
}

impl Config {
    pub(super) const ALL: [Config; 5] = [
        Config::PerProcess,
        Config::Coordinator,
        Config::SharedPerProcess,
        Config::SharedCoordinator,
        Config::Kill,
    ];

    pub(super) fn label(self) -> &'static str {
        match self {
            Config::PerProcess => "per-process reclaimers",
            Config::Coordinator => "coordinator",
            Config::SharedPerProcess => "shared, per-process reclaimers",
            Config::SharedCoordinator => "shared, coordinator",
            Config::Kill => "kill-based (kernel OOM killer)",
        }
    }

    pub(super) fn short(self) -> &'static str {
        match self {
            Config::PerProcess => "per-process",
            Config::Coordinator => "coordinator",
            Config::SharedPerProcess => "shared per-process",
            Config::SharedCoordinator => "shared coordinator",
            Config::Kill => "kill-based",
        }
    }

    pub(super) fn mode(self) -> &'static str {
        match self {
            Config::Kill => "plain",
            Config::SharedPerProcess | Config::SharedCoordinator => "shared",
            _ => "volatile",
        }
    }

    /// Whether a coordinator orders the purges.
    pub(super) fn coordinated(self) -> bool {
        matches!(self, Config::Coordinator | Config::SharedCoordinator)
    }
}

pub(super) struct Scenario {
    pub(super) limit: u64,
    pub(super) chunks: usize,
    pub(super) neighbour: Ramp,
}

/// One configuration's run.
#[derive(Default)]
pub(super) struct Run {
    /// Per second, every participant summed.
    pub(super) seconds: Seconds,
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
    pub(super) samples: Samples,
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
        if let Some(s) = self.seconds.take(line) {
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

pub(super) fn run_one(s: &Scenario, config: Config) -> Result<Run, String> {
    let cg = cgroup::try_child("vrange-bench-coord", s.limit)?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let dir = tempfile::Builder::new()
        .prefix("vrange-bench-coord")
        .tempdir()
        .map_err(|e| format!("temporary directory: {e}"))?;
    let socket: PathBuf = dir.path().join("coordinator.sock");
    let mut coordinator = if config.coordinated() {
        Some(InProcess::start(vrange_coordinator::Options {
            socket: socket.clone(),
            scope: vrange_coordinator::Scope::Cgroup(cg.cgroup().path().to_path_buf()),
            ..vrange_coordinator::Options::default()
        })?)
    } else {
        None
    };
    let setting = if config.coordinated() {
        socket.display().to_string()
    } else {
        "off".to_string()
    };
    let spawn = |args: &[String]| -> Result<Proc, String> {
        let mut cmd = clean_command(&exe);
        cmd.arg("role")
            .args(args)
            .env("VRANGE_STATS_DIR", "off")
            .env("VRANGE_COORDINATOR", &setting);
        cgroup::join(&mut cmd, cg.cgroup())?;
        Proc::try_spawn(cmd)
    };
    let epoch = now_ns() + SEC / 2;
    let end = epoch + s.neighbour.total().as_nanos() as u64;
    let mut neighbour = Neighbour::start(spawn, s.neighbour.role_args(epoch, end))?;
    let participant_args = |i: usize, fill_at: u64, prefill: bool| -> Vec<String> {
        vec![
            "coordinate-participant".into(),
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
        seconds: Seconds::new(s.neighbour.seconds()),
        per: vec![Second::default(); RATES.len()],
        ..Run::default()
    };
    let mut seats = Vec::new();
    // When each participant was killed, until it serves again.
    let mut down_since: Vec<Option<f64>> = vec![None; RATES.len()];
    for i in 0..RATES.len() {
        let fill_at = epoch + i as u64 * STAGGER.as_nanos() as u64;
        seats.push(Seat::new(spawn(&participant_args(i, fill_at, true))?));
    }
    let since = |now: u64| (now as f64 - epoch as f64) / 1e9;
    let threshold = headroom(s.limit);
    let mut pressure_since: Option<f64> = None;
    let mut last_response = 0.0f64;
    let mut next_sample = 0u64;
    loop {
        let now = now_ns();
        let t = since(now);
        for (i, seat) in seats.iter_mut().enumerate() {
            let killed = seat
                .poll(now, end, |line| {
                    if line == "serving" {
                        if let Some(d) = down_since[i].take() {
                            run.add_down(d, t, RATES[i] as f64);
                        }
                    }
                    run.take(i, line, t);
                })
                .map_err(|e| format!("{}: participant {i} {e}", config.label()))?;
            if killed {
                run.kills.push((i, t));
                down_since[i] = Some(t);
            }
            if seat.restart_due(now) {
                seat.fill(spawn(&participant_args(i, now, false))?);
            }
        }
        if seats.iter().all(Seat::done) && now >= end {
            break;
        }
        if now > end + 20 * SEC {
            return Err(format!("{}: the participants did not end", config.label()));
        }
        if now < end {
            neighbour
                .keep_up(spawn, t)
                .map_err(|e| format!("{}: {e}", config.label()))?;
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
                run.samples.0.push(Sample {
                    t,
                    usage,
                    neighbour: procfs::rss_lazy_kb(neighbour.pid()).0 * 1024,
                    service: 0,
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
    for (i, down) in down_since.iter().enumerate() {
        if let Some(d) = *down {
            run.add_down(d, since(end), RATES[i] as f64);
        }
    }
    neighbour.wait();
    run.neighbour_kills = std::mem::take(&mut neighbour.kills);
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
