//! The neighbour of the cache and coordinate scenarios: a process in the scenario's memory
//! cgroup (this executable, `role neighbour`) that holds nothing during a warm-up, then ramps
//! its resident memory 0 → peak → 0 (a raised cosine), then holds nothing again until the end
//! ([`Ramp`]). Pages are written as it grows and dropped as it shrinks (a vrange-testkit
//! [`Hog`]). Its memory follows the scenario's epoch, not its own start, so a neighbour started
//! again after an OOM kill takes the ramp up where it was ([`Neighbour`]).

use std::time::{Duration, Instant};
use vrange_sys::clock::now_ns;
use vrange_testkit::hog::Hog;
use vrange_testkit::proc::{Exit, Proc};

/// The neighbour's demand over a scenario.
pub struct Ramp {
    pub peak: u64,
    pub warmup: Duration,
    pub period: Duration,
    pub tail: Duration,
}

impl Ramp {
    /// The scenario's length: warm-up, ramp and tail.
    pub fn total(&self) -> Duration {
        self.warmup + self.period + self.tail
    }

    /// Whole seconds the scenario's per-second counts cover.
    pub fn seconds(&self) -> usize {
        self.total().as_secs_f64().ceil() as usize
    }

    /// The neighbour's target `t` seconds after the epoch.
    pub fn at(&self, t: f64) -> u64 {
        target(
            self.peak,
            self.warmup.as_millis() as u64,
            self.period.as_millis() as u64,
            (t.max(0.0) * 1e3) as u64,
        )
    }

    /// The role's arguments for a scenario from `epoch` to `end` (ns, `now_ns`'s clock).
    pub fn role_args(&self, epoch: u64, end: u64) -> Vec<String> {
        vec![
            "neighbour".into(),
            self.peak.to_string(),
            epoch.to_string(),
            self.warmup.as_millis().to_string(),
            self.period.as_millis().to_string(),
            end.to_string(),
        ]
    }
}

/// The neighbour's resident bytes at `t_ms` after the epoch: none during the warm-up, then a
/// raised cosine 0 → `peak` → 0 over `period_ms`, then none.
fn target(peak: u64, warmup_ms: u64, period_ms: u64, t_ms: u64) -> u64 {
    if t_ms < warmup_ms || t_ms >= warmup_ms + period_ms {
        return 0;
    }
    let x = (t_ms - warmup_ms) as f64 / period_ms as f64;
    (peak as f64 * (1.0 - (2.0 * std::f64::consts::PI * x).cos()) / 2.0) as u64
}

/// `neighbour PEAK EPOCH_NS WARMUP_MS PERIOD_MS END_NS`: resident memory following the ramp
/// until `END_NS`; says "ready" once mapped and "done" at the end.
pub fn role(args: &[String]) -> i32 {
    let nums: Vec<u64> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let &[peak, epoch, warmup_ms, period_ms, end] = nums.as_slice() else {
        eprintln!("usage: vrange-bench role neighbour PEAK EPOCH_NS WARMUP_MS PERIOD_MS END_NS");
        return 2;
    };
    let Ok(mut hog) = Hog::new(peak as usize) else {
        eprintln!("neighbour: cannot map {peak} bytes");
        return 1;
    };
    println!("ready");
    loop {
        let now = now_ns();
        if now >= end {
            break;
        }
        let t_ms = now.saturating_sub(epoch) / 1_000_000;
        hog.hold(target(peak, warmup_ms, period_ms, t_ms) as usize);
        std::thread::sleep(Duration::from_millis(10));
    }
    println!("done");
    0
}

/// A running neighbour, started again whenever the OOM killer takes it before the end.
pub struct Neighbour {
    proc: Proc,
    args: Vec<String>,
    /// Seconds after the epoch at which it was found killed.
    pub kills: Vec<f64>,
}

impl Neighbour {
    /// Starts one with `args` ([`Ramp::role_args`]) through `spawn` (the suite's command in the
    /// scenario's cgroup) and waits until it is ready.
    pub fn start(
        spawn: impl Fn(&[String]) -> Result<Proc, String>,
        args: Vec<String>,
    ) -> Result<Neighbour, String> {
        let mut proc = spawn(&args)?;
        if proc
            .line("ready", Instant::now() + Duration::from_secs(10))
            .is_none()
        {
            let exit = proc.wait(Duration::from_secs(1));
            return Err(format!(
                "the neighbour did not start ({exit}): {}",
                proc.stderr()
            ));
        }
        Ok(Neighbour {
            proc,
            args,
            kills: Vec::new(),
        })
    }

    pub fn pid(&self) -> i32 {
        self.proc.pid()
    }

    /// Before the end: starts it again if it was killed (at `t` seconds after the epoch); any
    /// other end is an error, except exit 0: the role exits 0 only once its own clock reached
    /// the end, which a busy supervisor's loop may see before its `now` does.
    pub fn keep_up(
        &mut self,
        spawn: impl Fn(&[String]) -> Result<Proc, String>,
        t: f64,
    ) -> Result<(), String> {
        match self.proc.ended() {
            Some(Exit::Signal(libc::SIGKILL)) => {
                self.kills.push(t);
                self.proc = spawn(&self.args)?;
                Ok(())
            }
            Some(Exit::Code(0)) | None => Ok(()),
            Some(e) => Err(format!("the neighbour ended: {e}: {}", self.proc.stderr())),
        }
    }

    /// Waits for it to end after the scenario's end.
    pub fn wait(&mut self) -> Exit {
        self.proc.wait(Duration::from_secs(10))
    }
}

#[cfg(test)]
mod tests {
    use super::target;

    #[test]
    fn the_neighbour_ramps_up_and_down() {
        assert_eq!(target(100, 1000, 10_000, 500), 0);
        assert_eq!(target(100, 1000, 10_000, 6000), 100);
        assert!(target(100, 1000, 10_000, 3500) > 40);
        assert_eq!(target(100, 1000, 10_000, 11_000), 0);
    }
}
