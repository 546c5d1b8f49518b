//! What the services of the cache and coordinate scenarios share: the dice of their requests
//! ([`Rng`], [`Zipf`]), the line they print every second and its sums ([`Second`],
//! [`Seconds`]), the supervisor that starts a killed one again ([`Seat`]), and the samples the
//! suite takes of their cgroup ([`Samples`]).

use super::neighbour::Neighbour;
use super::plot::{self, Axis, Series, Unit};
use super::report;
use super::Ctx;
use std::ops::Deref;
use std::time::{Duration, Instant};
use vrange_sys::cgroup::MemCgroup;
use vrange_sys::clock::now_ns;
use vrange_testkit::proc::{Exit, Proc};
use vrange_testkit::procfs;
use vrange_testkit::role::Reply;

pub const MIB: u64 = 1 << 20;
pub const SEC: u64 = 1_000_000_000;
/// How long a killed service stays down before its supervisor starts it again.
pub const RESTART: Duration = Duration::from_secs(1);

/// The headroom under which the reclaimers purge at their default (`VRANGE_HEADROOM=auto`),
/// and the coordinator at the daemon's, in a cgroup of `limit` bytes.
pub fn headroom(limit: u64) -> u64 {
    vrange::short::auto_threshold(limit)
}

/// xorshift64* (Vigna), seeded through splitmix64: the generator of the C workloads
/// (`c/prng.h`), for the requests' dice.
pub struct Rng(u64);

impl Rng {
    /// A generator whose state is `seed` mixed (never zero).
    pub fn new(seed: u64) -> Rng {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)).max(1))
    }

    pub fn next(&mut self) -> u64 {
        let x = &mut self.0;
        *x ^= *x >> 12;
        *x ^= *x << 25;
        *x ^= *x >> 27;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// Keys `0..n` drawn with probability ∝ 1/(k+1)^s.
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    pub fn new(n: usize, s: f64) -> Zipf {
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = (0..n.max(1))
            .map(|k| {
                acc += 1.0 / ((k + 1) as f64).powf(s);
                acc
            })
            .collect();
        cdf.iter_mut().for_each(|c| *c /= acc);
        Zipf { cdf }
    }

    pub fn sample(&self, rng: &mut Rng) -> usize {
        let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1)
    }
}

/// One second of a service: its requests and what became of them (a suite counts what
/// concerns it and leaves the rest zero), and the bytes its cache held at the second's end.
#[derive(Default, Clone, Copy, Debug)]
pub struct Second {
    pub req: u64,
    pub hit: u64,
    pub miss: u64,
    /// Lookups that found a value purged (cache), or chunks found purged (coordinate).
    pub purged: u64,
    pub wrong: u64,
    /// Inserts the cache refused.
    pub failed: u64,
    pub bytes: u64,
}

impl Second {
    /// Adds `o`'s counts (bytes: the larger).
    pub fn add(&mut self, o: &Second) {
        self.req += o.req;
        self.hit += o.hit;
        self.miss += o.miss;
        self.purged += o.purged;
        self.wrong += o.wrong;
        self.failed += o.failed;
        self.bytes = self.bytes.max(o.bytes);
    }

    /// Hits over requests (0 without requests).
    pub fn rate(&self) -> f64 {
        if self.req == 0 {
            0.0
        } else {
            self.hit as f64 / self.req as f64
        }
    }

    /// The line a service prints for second `n` after the epoch.
    pub fn line(&self, n: u64) -> String {
        format!(
            "sec n={n} req={} hit={} miss={} purged={} wrong={} failed={} bytes={}",
            self.req, self.hit, self.miss, self.purged, self.wrong, self.failed, self.bytes
        )
    }

    /// A service's line for a second: the second and its counts.
    pub fn parse(line: &str) -> Option<(usize, Second)> {
        let r = Reply::parse(line);
        if r.tag != "sec" {
            return None;
        }
        let get = |k| r.get::<u64>(k).unwrap_or(0);
        let s = Second {
            req: get("req"),
            hit: get("hit"),
            miss: get("miss"),
            purged: get("purged"),
            wrong: get("wrong"),
            failed: get("failed"),
            bytes: get("bytes"),
        };
        Some((r.get("n")?, s))
    }
}

/// The seconds of a scenario, every service's lines summed into the second they count.
#[derive(Default)]
pub struct Seconds(Vec<Second>);

impl Seconds {
    pub fn new(n: usize) -> Seconds {
        Seconds(vec![Second::default(); n])
    }

    /// Adds a service's line for a second (a second past the scenario is dropped); its
    /// counts, if it is one.
    pub fn take(&mut self, line: &str) -> Option<Second> {
        let (n, s) = Second::parse(line)?;
        if let Some(slot) = self.0.get_mut(n) {
            slot.add(&s);
        }
        Some(s)
    }

    /// The whole scenario.
    pub fn total(&self) -> Second {
        self.sum(|_| true)
    }

    /// The hit rate over the seconds `keep` accepts.
    pub fn rate_where(&self, keep: impl Fn(usize) -> bool) -> f64 {
        self.sum(keep).rate()
    }

    fn sum(&self, keep: impl Fn(usize) -> bool) -> Second {
        let mut t = Second::default();
        for (_, s) in self.0.iter().enumerate().filter(|(n, _)| keep(*n)) {
            t.add(s);
        }
        t
    }
}

impl Deref for Seconds {
    type Target = [Second];

    fn deref(&self) -> &[Second] {
        &self.0
    }
}

/// A sample of the scenario's cgroup, `t` seconds after the epoch; bytes.
#[derive(Clone, Copy, Default)]
pub struct Sample {
    pub t: f64,
    pub usage: u64,
    /// The neighbour's RSS.
    pub neighbour: u64,
    /// The service's RSS, where the suite samples it (cache).
    pub service: u64,
}

#[derive(Default)]
pub struct Samples(pub Vec<Sample>);

impl Samples {
    /// The mean of `f` over the samples of second `n`.
    pub fn mean_in(&self, n: usize, f: impl Fn(&Sample) -> u64) -> Option<f64> {
        let v: Vec<f64> = self
            .0
            .iter()
            .filter(|s| s.t >= n as f64 && s.t < (n + 1) as f64)
            .map(|s| f(s) as f64)
            .collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    }

    /// The neighbour's memory in percent of `limit`, second by second, for the plots.
    pub fn neighbour_series(&self, seconds: usize, limit: u64) -> Series {
        Series::new(
            "neighbour (% of limit)",
            (0..seconds)
                .filter_map(|i| {
                    let m = self.mean_in(i, |x| x.neighbour)?;
                    Some((i as f64 + 0.5, 100.0 * m / limit as f64))
                })
                .collect(),
        )
    }
}

/// What [`supervise`] saw of a scenario.
pub struct Supervised {
    /// The cgroup every 100 ms.
    pub samples: Samples,
    /// Seconds after the epoch at which the service was found killed (and started again).
    pub kills: Vec<f64>,
    /// Times the service was started.
    pub starts: usize,
    /// Seconds after the epoch at which the neighbour was found killed (and started again).
    pub neighbour_kills: Vec<f64>,
}

/// Runs a scenario from `epoch` to `end` (ns, `now_ns`'s clock): the service `spawn_service`
/// starts (again [`RESTART`] after a kill), whose every line goes to `take`, beside
/// `neighbour` (started again by `spawn_neighbour` after a kill), sampling `cg` every 100 ms;
/// waits for both to end. `label` names the run in errors.
pub fn supervise(
    label: &str,
    cg: &MemCgroup,
    (epoch, end): (u64, u64),
    mut neighbour: Neighbour,
    spawn_neighbour: impl Fn(&[String]) -> Result<Proc, String>,
    spawn_service: impl Fn() -> Result<Proc, String>,
    mut take: impl FnMut(&str),
) -> Result<Supervised, String> {
    let mut run = Supervised {
        samples: Samples::default(),
        kills: Vec::new(),
        starts: 1,
        neighbour_kills: Vec::new(),
    };
    let mut service = Seat::new(spawn_service()?);
    let mut next_sample = 0u64;
    let since = |now: u64| (now as f64 - epoch as f64) / 1e9;
    loop {
        let now = now_ns();
        let killed = service
            .poll(now, end, &mut take)
            .map_err(|e| format!("{label}: the service {e}"))?;
        if killed {
            run.kills.push(since(now));
        }
        if service.restart_due(now) {
            service.fill(spawn_service()?);
            run.starts += 1;
        }
        if service.done() && now >= end {
            break;
        }
        if now > end + 20 * SEC {
            return Err(format!("{label}: the service did not end"));
        }
        if now < end {
            neighbour
                .keep_up(&spawn_neighbour, since(now))
                .map_err(|e| format!("{label}: {e}"))?;
        }
        if now >= next_sample && now >= epoch && now < end {
            next_sample = now + SEC / 10;
            run.samples.0.push(Sample {
                t: since(now),
                usage: cg.usage().unwrap_or(0),
                neighbour: procfs::rss_lazy_kb(neighbour.pid()).0 * 1024,
                service: service
                    .proc()
                    .map_or(0, |p| procfs::rss_lazy_kb(p.pid()).0 * 1024),
            });
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    neighbour.wait();
    run.neighbour_kills = std::mem::take(&mut neighbour.kills);
    Ok(run)
}

/// A scenario's plot over time, `series` and the neighbour's memory as `samples` measured it
/// (percent of `limit`), written as `NAME.svg` in the output directory.
#[allow(clippy::too_many_arguments)]
pub fn plot_over_time(
    ctx: &Ctx,
    name: &str,
    title: String,
    y_label: &str,
    mut series: Vec<Series>,
    samples: &Samples,
    seconds: usize,
    limit: u64,
) -> Result<(), String> {
    series.push(samples.neighbour_series(seconds, limit));
    let svg = plot::lines(
        &ctx.figure(title),
        &Axis::linear("time (s)", Unit::Plain),
        &Axis::linear(y_label, Unit::Plain),
        &series,
    );
    report::write_file(&ctx.out, &format!("{name}.svg"), &svg)?;
    Ok(())
}

/// The targets table's last row: `what` read wrong by any peer (must be none).
pub fn wrong_row(what: &str, wrong: u64) -> Vec<String> {
    vec![
        format!("wrong {what} (every peer)"),
        if wrong == 0 {
            "met: 0".into()
        } else {
            format!("FAILED: {wrong}")
        },
    ]
}

/// Sleeps until `t` (ns, `now_ns`'s clock).
pub fn sleep_until(t: u64) {
    let now = now_ns();
    if now < t {
        std::thread::sleep(Duration::from_nanos(t - now));
    }
}

/// A service's process and its supervisor: one killed before the end is started again after
/// [`RESTART`] with an empty cache, unless that would leave it less than a second.
#[derive(Default)]
pub struct Seat {
    proc: Option<Proc>,
    restart_at: Option<u64>,
}

impl Seat {
    pub fn new(proc: Proc) -> Seat {
        Seat {
            proc: Some(proc),
            restart_at: None,
        }
    }

    /// The running process, if any.
    pub fn proc(&self) -> Option<&Proc> {
        self.proc.as_ref()
    }

    /// At `now` (ns; the scenario ends at `end`): hands each line the process printed to
    /// `take`, and if it ended, empties the seat. `Ok(true)`: it was killed before the end (its
    /// restart is due at [`Seat::restart_due`]). A process that fails (any end but exit 0, which
    /// it makes only at the end) is an error (which says how it ended).
    pub fn poll(&mut self, now: u64, end: u64, mut take: impl FnMut(&str)) -> Result<bool, String> {
        let Some(p) = self.proc.as_mut() else {
            return Ok(false);
        };
        while let Some(line) = p.line("", Instant::now()) {
            take(&line);
        }
        let Some(exit) = p.ended() else {
            return Ok(false);
        };
        while let Some(line) = p.line("", Instant::now() + Duration::from_millis(200)) {
            take(&line);
        }
        let killed = now < end && exit == Exit::Signal(libc::SIGKILL);
        if killed {
            let at = now + RESTART.as_nanos() as u64;
            self.restart_at = (at + SEC < end).then_some(at);
        } else if exit != Exit::Code(0) {
            // Exit 0 comes only once the process's own clock reached the end, which a busy
            // supervisor may see before its `now` does.
            return Err(format!("ended: {exit}: {}", p.stderr().trim()));
        }
        self.proc = None;
        Ok(killed)
    }

    /// Whether it is empty and its restart due at `now`: then [`Seat::fill`] it.
    pub fn restart_due(&self, now: u64) -> bool {
        self.proc.is_none() && self.restart_at.is_some_and(|at| now >= at)
    }

    pub fn fill(&mut self, proc: Proc) {
        self.proc = Some(proc);
        self.restart_at = None;
    }

    /// Whether it is empty for good: ended, no restart to come.
    pub fn done(&self) -> bool {
        self.proc.is_none() && self.restart_at.is_none()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zipf_favours_the_first_keys() {
        let z = Zipf::new(1000, 0.8);
        let mut rng = Rng::new(7);
        let draws: Vec<usize> = (0..10_000).map(|_| z.sample(&mut rng)).collect();
        assert!(draws.iter().all(|&k| k < 1000));
        let low = draws.iter().filter(|&&k| k < 10).count();
        let high = draws.iter().filter(|&&k| k >= 990).count();
        assert!(low > 5 * high, "{low} {high}");
        let z = Zipf::new(8, 1.0);
        let mut counts = [0u32; 8];
        for _ in 0..10_000 {
            counts[z.sample(&mut rng)] += 1;
        }
        assert!(counts[0] > 5 * counts[7], "{counts:?}");
        assert!(counts.iter().all(|&c| c > 0), "{counts:?}");
    }

    #[test]
    fn a_second_reads_back_as_printed() {
        let s = Second {
            req: 120,
            hit: 97,
            miss: 3,
            purged: 20,
            wrong: 0,
            failed: 1,
            bytes: 4096,
        };
        let (n, r) = Second::parse(&s.line(5)).expect("a sec line");
        assert_eq!(n, 5);
        assert_eq!(format!("{r:?}"), format!("{s:?}"));
        let mut seconds = Seconds::new(2);
        assert!(seconds.take("purge chunk=1 age_ms=3").is_none());
        seconds.take(&s.line(1));
        seconds.take(&s.line(9));
        assert_eq!(seconds[1].req, 120);
        assert_eq!(seconds.total().req, 120);
        assert_eq!(seconds.rate_where(|n| n == 0), 0.0);
    }
}
