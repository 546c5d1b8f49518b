//! The reclaimer's settings as a typed value: read them with [`Config::current`], change what
//! you need, [`Config::apply`]. The environment (`VRANGE_*`, read once at first use) and the
//! string API ([`set_option`](crate::set_option), C `vrange_set_option`) are parsed into this
//! same type, with the one grammar of README's "Settings".
//!
//! ```
//! use std::time::Duration;
//! use vrange::{Config, Headroom};
//! let mut c = Config::current();
//! c.budget = 64 << 20;                       // resident volatile bytes before purging
//! c.headroom = Headroom::Bytes(32 << 20);    // keep 32 MiB below the cgroup's limit
//! c.poll_interval = Duration::from_millis(50);
//! c.apply()?;
//! # Ok::<(), vrange::OptionError>(())
//! ```

use crate::reclaim;
use crate::OptionError;
use std::fmt;
use std::time::Duration;

/// The reclaimer and its pressure sources. Fields are public; the struct is `non_exhaustive`,
/// so start from [`Config::current`] (or [`Config::defaults`]) rather than a literal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// Whether the reclaimer thread runs (`VRANGE_RECLAIMER`). Without it only explicit purges
    /// happen, and hybrid ranges are never armed.
    pub reclaimer: bool,
    /// How long a hybrid range stays volatile before it is handed to the kernel's lazy-free
    /// path (`VRANGE_ARM_DELAY_MS`).
    pub arm_delay: Duration,
    /// Resident volatile bytes allowed before the oldest are purged; 0: no budget
    /// (`VRANGE_BUDGET`).
    pub budget: u64,
    /// When the memory cgroup's headroom is low enough to purge (`VRANGE_HEADROOM`).
    pub headroom: Headroom,
    /// The reclaimer's tick: headroom, budget and arming checks, event pacing; below 1 ms it
    /// is 1 ms (`VRANGE_POLL_MS`).
    pub poll_interval: Duration,
    /// The PSI trigger on the system's and the cgroup's memory pressure, or none
    /// (`VRANGE_PSI`).
    pub psi: Option<Psi>,
    /// cgroup v1 vmpressure medium and critical events (`VRANGE_VMPRESSURE`).
    pub vmpressure: bool,
    /// Percent of volatile bytes purged per PSI or medium event, 1 to 100
    /// (`VRANGE_PRESSURE_SHARE`).
    pub pressure_share: u8,
}

/// The headroom source's threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Headroom {
    /// The cgroup's limit / 16, within [4 MiB, 256 MiB].
    Auto,
    /// No headroom source.
    Off,
    /// Purge when limit − usage falls below this many bytes.
    Bytes(u64),
}

/// A PSI trigger: fires when tasks stalled on memory for `stall` within `window`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Psi {
    /// "full" (all non-idle tasks stalled at once) rather than "some" (at least one).
    pub full: bool,
    /// Stall time that fires the trigger, more than zero and at most `window`.
    pub stall: Duration,
    /// At most 10 s. Rounded up to what the kernel accepts from the process: at least 500 ms,
    /// and a multiple of 2 s without CAP_SYS_RESOURCE.
    pub window: Duration,
}

impl Config {
    /// The compiled-in defaults (README's "Settings" table), ignoring the environment.
    pub fn defaults() -> Config {
        Config {
            reclaimer: true,
            arm_delay: Duration::from_millis(1000),
            budget: 0,
            headroom: Headroom::Auto,
            poll_interval: Duration::from_millis(100),
            psi: Some(Psi {
                full: false,
                stall: Duration::from_millis(100),
                window: Duration::from_secs(2),
            }),
            vmpressure: true,
            pressure_share: 25,
        }
    }

    /// The settings in force: the defaults with the environment applied (read once, at the
    /// first use of vrange) and every change applied since. No allocation.
    pub fn current() -> Config {
        reclaim::config::snapshot()
    }

    /// This configuration with option `name` (a `VRANGE_*` name, see
    /// [`OPTIONS`](crate::OPTIONS)) set from `value` in the environment's grammar.
    ///
    /// # Errors
    /// [`OptionError::UnknownName`], or [`OptionError::InvalidValue`] saying what the option
    /// accepts.
    pub fn with_option(mut self, name: &str, value: &str) -> Result<Config, OptionError> {
        reclaim::config::parse(&mut self, name, value.as_bytes())?;
        Ok(self)
    }

    /// Makes this configuration the one in force. The reclaimer reopens its sources at its next
    /// tick; a disabled reclaimer may start.
    ///
    /// # Errors
    /// [`OptionError::InvalidValue`] for a `pressure_share` outside 1 to 100 or a PSI trigger
    /// the kernel would refuse (stall zero or above the window, window above 10 s); nothing
    /// changes then.
    pub fn apply(self) -> Result<(), OptionError> {
        reclaim::config::validate(&self)?;
        reclaim::config::get();
        reclaim::config::store(&self);
        reclaim::config_changed();
        Ok(())
    }

    /// Option `name` of this configuration, in the grammar it is set with (for messages: the
    /// value to show in a warning about a malformed setting). No allocation.
    pub fn show<'a>(&'a self, name: &'a str) -> impl fmt::Display + 'a {
        reclaim::config::Shown(self, name)
    }
}

impl Default for Config {
    fn default() -> Config {
        Config::defaults()
    }
}
