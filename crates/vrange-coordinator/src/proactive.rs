//! Proactive mode (`vrange daemon --proactive`): memory back before anyone asks.
//!
//! Once per [`Proactive::interval`] the controller looks at the scope: its stall (PSI `some`:
//! the share of the last interval and the kernel's ten-second average, whichever is higher),
//! the pressure events since its last look, and how many purged bytes the participants took
//! back since (their refaults: purged ranges reused or freed, from their inventories). While
//! all are quiet it takes a step: [`Proactive::step_pct`] of the scope's usage, from the coldest
//! volatile memory first in the global order (only memory volatile for at least
//! [`Proactive::min_idle`]: hot ranges never), and on cgroup v2 what the volatile memory cannot
//! give from the kernel's own reclaim (`memory.reclaim`: page cache, without swap). A stall
//! above [`Proactive::stall_pct`], any pressure event, or refaults above half a step hold it at
//! once; it steps again when they are quiet.
//!
//! Unlike a controller of `memory.high` (senpai, TMO), it never lowers a limit: a container
//! whose load rises finds its limit where it was, and vrange's usual purges on pressure come
//! first. On cgroup v1, whose cgroups have no stall file of their own, the stall read is the
//! machine's (any task's stall holds it: the cautious reading) and vmpressure events count as
//! pressure.
//!
//! The decisions are a pure function of the readings ([`Controller::decide`]), tested with
//! made-up ones; the server reads the files and sends the purges.

use std::path::PathBuf;
use std::time::{Duration, Instant};
use vrange_sys::pressure::PsiReading;

/// How the proactive mode runs (`Options::proactive`; `None`: off).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Proactive {
    /// The stall it keeps under: percent of the time some task of the scope stalled on memory
    /// (PSI `some`; default 0.1).
    pub stall_pct: f64,
    /// Volatile memory idle at least this long is a candidate (default 30 s).
    pub min_idle: Duration,
    /// Time between steps (default 1 s).
    pub interval: Duration,
    /// A step, in percent of the scope's usage (default 1: a fifth of the memory in twenty
    /// quiet seconds, when that much is cold).
    pub step_pct: f64,
}

impl Default for Proactive {
    fn default() -> Proactive {
        Proactive {
            stall_pct: 0.1,
            min_idle: Duration::from_secs(30),
            interval: Duration::from_secs(1),
            step_pct: 1.0,
        }
    }
}

/// The smallest step: below it a step costs more in messages than it frees.
const MIN_STEP: u64 = 1 << 20;
/// How long a step's requests are waited for before the next step may go.
const STEP_PATIENCE: Duration = Duration::from_secs(10);

/// What the mode did so far (metrics, `vrange top`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Report {
    /// Bytes freed by its steps: purged by participants for them, from shared regions, and
    /// reclaimed by the kernel at its request.
    pub saved: u64,
    /// The usage it aims for now: the usage less a step while it steps, the usage while it
    /// holds.
    pub target: u64,
    /// Looks that found a stall, pressure or refaults, and held.
    pub stalls: u64,
    /// Steps taken.
    pub steps: u64,
}

/// One look at the scope.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Reading {
    /// Bytes charged to the scope.
    pub usage: u64,
    /// Percent stalled (`None`: no stall file).
    pub stall_pct: Option<f64>,
    /// Pressure events (PSI trigger, vmpressure) since the last look.
    pub events: u64,
    /// Purged bytes the participants took back since the last look.
    pub refaulted: u64,
}

/// What to do at a look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Free this many bytes, coldest first.
    Step(u64),
    /// Hold: the stall is above the target, pressure came, or purged memory came back.
    Hold,
}

/// The controller's state between looks.
pub(crate) struct Controller {
    pub settings: Proactive,
    next: Instant,
    stall_file: Option<PathBuf>,
    last_psi: Option<(Instant, PsiReading)>,
    /// The requests of the last step not answered yet, and when it was taken.
    open: Vec<u64>,
    stepped_at: Option<Instant>,
    pub report: Report,
}

impl Controller {
    pub fn new(settings: Proactive, stall_file: Option<PathBuf>, now: Instant) -> Controller {
        Controller {
            settings,
            next: now + settings.interval,
            stall_file,
            last_psi: None,
            open: Vec::new(),
            stepped_at: None,
            report: Report::default(),
        }
    }

    /// Whether a look is due: its interval passed and the last step's requests are answered
    /// (or waited for long enough).
    pub fn due(&self, now: Instant) -> bool {
        now >= self.next
            && (self.open.is_empty()
                || self
                    .stepped_at
                    .is_some_and(|t| now.duration_since(t) >= STEP_PATIENCE))
    }

    /// The stall now: the share of the time since the last reading, or the kernel's
    /// ten-second average if higher. `None` without a stall file, or at the first reading.
    pub fn stall(&mut self, now: Instant) -> Option<f64> {
        let reading = PsiReading::read(self.stall_file.as_deref()?).ok()?;
        let last = self.last_psi.replace((now, reading));
        let (then, before) = last?;
        let share = reading.some_pct_since(&before, now.duration_since(then));
        Some(share.max(reading.some_avg10))
    }

    /// Decides at a look and schedules the next one.
    pub fn decide(&mut self, now: Instant, r: &Reading) -> Decision {
        self.next = now + self.settings.interval;
        let step = ((r.usage as f64 * self.settings.step_pct / 100.0) as u64).max(MIN_STEP);
        let stalled = r.stall_pct.is_some_and(|p| p > self.settings.stall_pct);
        if stalled || r.events > 0 || r.refaulted > step / 2 {
            self.report.stalls += 1;
            self.report.target = r.usage;
            return Decision::Hold;
        }
        self.report.target = r.usage.saturating_sub(step);
        Decision::Step(step)
    }

    /// A step was taken with these requests out.
    pub fn stepped(&mut self, now: Instant, requests: Vec<u64>, freed_now: u64) {
        self.report.steps += 1;
        self.report.saved = self.report.saved.saturating_add(freed_now);
        self.open = requests;
        self.stepped_at = Some(now);
    }

    /// A participant answered request `id` with `bytes` freed: counted if the request was a
    /// step's.
    pub fn answered(&mut self, id: u64, bytes: u64) {
        if let Some(at) = self.open.iter().position(|&x| x == id) {
            self.open.swap_remove(at);
            self.report.saved = self.report.saved.saturating_add(bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn quiet(usage: u64) -> Reading {
        Reading {
            usage,
            stall_pct: Some(0.0),
            events: 0,
            refaulted: 0,
        }
    }

    #[test]
    fn it_steps_while_quiet_and_holds_at_once_for_a_stall_pressure_or_refaults() {
        let now = Instant::now();
        let mut c = Controller::new(Proactive::default(), None, now);
        assert!(!c.due(now), "the first look waits an interval");
        let t = now + Duration::from_secs(1);
        assert!(c.due(t));
        // 1 % of 400 MiB.
        assert_eq!(c.decide(t, &quiet(400 * MIB)), Decision::Step(4 * MIB));
        assert_eq!(c.report.target, 396 * MIB);
        // A small scope still steps by the smallest step.
        assert_eq!(c.decide(t, &quiet(10 * MIB)), Decision::Step(MIB));
        // A stall above the target (0.1 %) holds; at the target it does not.
        let stalled = Reading {
            stall_pct: Some(0.2),
            ..quiet(400 * MIB)
        };
        assert_eq!(c.decide(t, &stalled), Decision::Hold);
        assert_eq!(c.report.target, 400 * MIB);
        let at_target = Reading {
            stall_pct: Some(0.1),
            ..quiet(400 * MIB)
        };
        assert_eq!(c.decide(t, &at_target), Decision::Step(4 * MIB));
        // A pressure event holds.
        let event = Reading {
            events: 1,
            ..quiet(400 * MIB)
        };
        assert_eq!(c.decide(t, &event), Decision::Hold);
        // Refaults above half a step hold; below, they do not.
        let back = Reading {
            refaulted: 3 * MIB,
            ..quiet(400 * MIB)
        };
        assert_eq!(c.decide(t, &back), Decision::Hold);
        let few = Reading {
            refaulted: MIB,
            ..quiet(400 * MIB)
        };
        assert_eq!(c.decide(t, &few), Decision::Step(4 * MIB));
        assert_eq!(c.report.stalls, 3);
        // No stall file: the other signals alone.
        let unknown = Reading {
            stall_pct: None,
            ..quiet(400 * MIB)
        };
        assert_eq!(c.decide(t, &unknown), Decision::Step(4 * MIB));
    }

    #[test]
    fn a_step_waits_for_the_last_ones_answers_or_its_patience() {
        let now = Instant::now();
        let mut c = Controller::new(Proactive::default(), None, now);
        let t = now + Duration::from_secs(1);
        assert_eq!(c.decide(t, &quiet(400 * MIB)), Decision::Step(4 * MIB));
        c.stepped(t, vec![7, 8], MIB);
        let later = t + Duration::from_secs(1);
        assert!(!c.due(later), "two requests open");
        c.answered(7, 2 * MIB);
        c.answered(99, 5 * MIB);
        assert!(!c.due(later), "one request open");
        c.answered(8, MIB);
        assert!(c.due(later));
        assert_eq!(
            c.report.saved,
            4 * MIB,
            "what the step's requests freed, and its own"
        );
        assert_eq!(c.report.steps, 1);
        // A request never answered holds the next step for STEP_PATIENCE only.
        c.stepped(later, vec![9], 0);
        assert!(!c.due(later + Duration::from_secs(2)));
        assert!(c.due(later + STEP_PATIENCE));
    }
}
