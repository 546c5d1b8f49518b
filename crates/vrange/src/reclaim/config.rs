//! Reclaimer settings: the public, typed [`Config`], stored in atomics so that the mark path
//! (budget) and the reclaimer thread read them without locking. Read once from `VRANGE_*`
//! environment variables, changeable at run time with [`Config::apply`] or, by name, with
//! [`set_option`].
//!
//! Values follow the grammar of [`vrange_sys::settings`] (sizes with `K`, `KiB`, ... units, all
//! powers of 1024; switches `on`/`off`, `yes`/`no`, `true`/`false`, `1`/`0`; keywords in any
//! case). A malformed variable is reported once, in one line on stderr naming the variable, what
//! it accepts and the value used instead (the default), and [`set_option`] refuses it.
//!
//! | variable               | default              | meaning |
//! |------------------------|----------------------|---------|
//! | `VRANGE_RECLAIMER`     | `on`                 | `off`: no reclaimer thread (only explicit purges, and the kernel for hybrid ranges once armed; arming needs the thread) |
//! | `VRANGE_ARM_DELAY_MS`  | `1000`               | hybrid ranges volatile this long are handed to the kernel path |
//! | `VRANGE_BUDGET`        | `0` (none)           | resident volatile bytes allowed before the oldest are purged (a size) |
//! | `VRANGE_HEADROOM`      | `auto`               | purge when the cgroup's limit minus usage falls below this size; `auto` = limit/16 within [4 MiB, 256 MiB]; `off` (or `0`) |
//! | `VRANGE_POLL_MS`       | `100`                | how often headroom, budget and arming are checked; `0` means 1 |
//! | `VRANGE_PSI`           | `some 100000 2000000`| PSI trigger (kind, stall µs, window µs; 0 < stall <= window <= 10 s) on the system and cgroup v2 files; `off`. The window is rounded up to what the kernel accepts (see below) |
//! | `VRANGE_VMPRESSURE`    | `on`                 | cgroup v1 memory.pressure_level medium and critical events of reclaim aimed at this process's cgroup (not at a descendant, whose pressure purging here cannot relieve); `off` |
//! | `VRANGE_PRESSURE_SHARE`| `25`                 | percent (1 to 100) of volatile bytes purged per PSI or medium event (critical purges all) |
//!
//! Two values are accepted and adjusted rather than refused, silently because the meaning
//! stays: `VRANGE_POLL_MS=0` polls every millisecond (the fastest tick there is), and the PSI
//! window is raised to the kernel's minimum (500 ms, or a multiple of 2 s without
//! CAP_SYS_RESOURCE), which depends on the privileges of the thread that opens the trigger and
//! is applied there (`vrange_sys::pressure::psi_window_us`). Windows above the kernel's maximum of
//! 10 s are refused: capping them could leave the stall above the window, a trigger the kernel
//! refuses.

use crate::OptionError;
use std::fmt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8};
use std::time::Duration;
use vrange_sys::pressure::PSI_WINDOW_MAX_US;
use vrange_sys::settings::{self, parse_number, parse_size, parse_switch, Size};

/// `VRANGE_HEADROOM=auto`.
pub(crate) const HEADROOM_AUTO: u64 = crate::short::AUTO;

/// The settings in force, as atomics the mark path and the thread read without locking.
pub(crate) struct Atomics {
    pub enabled: AtomicBool,
    pub arm_delay_ms: AtomicU64,
    pub budget: AtomicU64,
    /// Bytes, 0 = off, [`HEADROOM_AUTO`].
    pub headroom: AtomicU64,
    pub poll_ms: AtomicU64,
    /// 0 = off, 1 = some, 2 = full.
    pub psi_kind: AtomicU8,
    pub psi_stall_us: AtomicU64,
    pub psi_window_us: AtomicU64,
    pub vmpressure: AtomicBool,
    pub pressure_share: AtomicU64,
    /// Bumped by every change, so the reclaimer reopens its sources.
    pub version: AtomicU64,
}

static CONFIG: Atomics = Atomics {
    enabled: AtomicBool::new(true),
    arm_delay_ms: AtomicU64::new(1000),
    budget: AtomicU64::new(0),
    headroom: AtomicU64::new(HEADROOM_AUTO),
    poll_ms: AtomicU64::new(100),
    psi_kind: AtomicU8::new(1),
    psi_stall_us: AtomicU64::new(100_000),
    psi_window_us: AtomicU64::new(2_000_000),
    vmpressure: AtomicBool::new(true),
    pressure_share: AtomicU64::new(25),
    version: AtomicU64::new(0),
};

/// The names [`set_option`] accepts, which are also the environment variables read at start.
pub const OPTIONS: [&str; 8] = [
    "VRANGE_RECLAIMER",
    "VRANGE_ARM_DELAY_MS",
    "VRANGE_BUDGET",
    "VRANGE_HEADROOM",
    "VRANGE_POLL_MS",
    "VRANGE_PSI",
    "VRANGE_VMPRESSURE",
    "VRANGE_PRESSURE_SHARE",
];

const MILLISECONDS: &str = "milliseconds";
const HEADROOM: &str = "auto, off or a size such as 64M";
const PSI: &str =
    "off, or some or full, then STALL_US WINDOW_US with 0 < STALL_US <= WINDOW_US <= 10000000";
const PERCENT: &str = "a percentage from 1 to 100";

/// What each option accepts, for messages and [`OptionError::InvalidValue`].
fn accepted(name: &str) -> Option<&'static str> {
    Some(match name {
        "VRANGE_RECLAIMER" | "VRANGE_VMPRESSURE" => settings::SWITCH_GRAMMAR,
        "VRANGE_ARM_DELAY_MS" | "VRANGE_POLL_MS" => MILLISECONDS,
        "VRANGE_BUDGET" => settings::SIZE_GRAMMAR,
        "VRANGE_HEADROOM" => HEADROOM,
        "VRANGE_PSI" => PSI,
        "VRANGE_PRESSURE_SHARE" => PERCENT,
        _ => return None,
    })
}

/// The settings, with the environment applied on first use.
pub(crate) fn get() -> &'static Atomics {
    // Fork-aware: a child forked while another thread read the environment reads it again.
    static ENV: vrange_sys::lock::ForkOnce<()> = vrange_sys::lock::ForkOnce::new();
    ENV.get_or_init(|| {
        let mut typed = Config::defaults();
        for name in OPTIONS {
            if let Some(value) = settings::var(name) {
                // A malformed variable keeps the default; say so once rather than fail the
                // program that happens to link vrange. No allocation: vrange-malloc may get
                // here from inside malloc.
                if let Err(OptionError::InvalidValue { accepted }) = parse(&mut typed, name, value)
                {
                    settings::warn(name, value, accepted, &Shown(&typed, name));
                }
            }
        }
        store(&typed);
    });
    &CONFIG
}

/// The settings now, as the typed [`Config`].
pub(crate) fn snapshot() -> Config {
    let c = get();
    let mut t = Config::defaults();
    t.reclaimer = c.enabled.load(Relaxed);
    t.arm_delay = Duration::from_millis(c.arm_delay_ms.load(Relaxed));
    t.budget = c.budget.load(Relaxed);
    t.headroom = match c.headroom.load(Relaxed) {
        HEADROOM_AUTO => Headroom::Auto,
        0 => Headroom::Off,
        n => Headroom::Bytes(n),
    };
    t.poll_interval = Duration::from_millis(c.poll_ms.load(Relaxed));
    t.psi = match c.psi_kind.load(Relaxed) {
        0 => None,
        kind => Some(Psi {
            full: kind == 2,
            stall: Duration::from_micros(c.psi_stall_us.load(Relaxed)),
            window: Duration::from_micros(c.psi_window_us.load(Relaxed)),
        }),
    };
    t.vmpressure = c.vmpressure.load(Relaxed);
    t.pressure_share = c.pressure_share.load(Relaxed) as u8;
    t
}

/// Stores validated settings and bumps the version, so the reclaimer reopens its sources.
pub(crate) fn store(t: &Config) {
    let c = &CONFIG;
    c.enabled.store(t.reclaimer, Relaxed);
    c.arm_delay_ms.store(millis(t.arm_delay), Relaxed);
    c.budget.store(t.budget, Relaxed);
    c.headroom.store(
        match t.headroom {
            Headroom::Auto => HEADROOM_AUTO,
            Headroom::Off => 0,
            Headroom::Bytes(n) => n.min(HEADROOM_AUTO - 1),
        },
        Relaxed,
    );
    // A zero period would spin: 1 ms is the fastest tick (documented).
    c.poll_ms.store(millis(t.poll_interval).max(1), Relaxed);
    match t.psi {
        None => c.psi_kind.store(0, Relaxed),
        Some(p) => {
            c.psi_kind.store(if p.full { 2 } else { 1 }, Relaxed);
            c.psi_stall_us.store(micros(p.stall), Relaxed);
            c.psi_window_us.store(micros(p.window), Relaxed);
        }
    }
    c.vmpressure.store(t.vmpressure, Relaxed);
    c.pressure_share.store(u64::from(t.pressure_share), Relaxed);
    c.version.fetch_add(1, Relaxed);
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Why typed settings cannot be applied, as the option they would be set with.
pub(crate) fn validate(t: &Config) -> Result<(), OptionError> {
    if !(1..=100).contains(&t.pressure_share) {
        return Err(OptionError::InvalidValue { accepted: PERCENT });
    }
    if let Some(p) = t.psi {
        let (stall, window) = (micros(p.stall), micros(p.window));
        if stall == 0 || stall > window || window > PSI_WINDOW_MAX_US {
            return Err(OptionError::InvalidValue { accepted: PSI });
        }
    }
    Ok(())
}

/// Sets one option by its environment-variable name, e.g. `set_option("VRANGE_BUDGET", "64M")`:
/// the string form of [`Config`].
///
/// # Errors
/// [`OptionError::UnknownName`] for a name not in [`OPTIONS`], [`OptionError::InvalidValue`]
/// for a malformed value; nothing changes then.
pub fn set_option(name: &str, value: &str) -> Result<(), OptionError> {
    Config::current().with_option(name, value)?.apply()
}

/// Parses option `name` (one of [`OPTIONS`]) in the environment's grammar into `t`.
pub(crate) fn parse(t: &mut Config, name: &str, v: &[u8]) -> Result<(), OptionError> {
    let accepted = accepted(name).ok_or(OptionError::UnknownName)?;
    let bad = OptionError::InvalidValue { accepted };
    match name {
        "VRANGE_RECLAIMER" => t.reclaimer = parse_switch(v).ok_or(bad)?,
        "VRANGE_ARM_DELAY_MS" => {
            t.arm_delay = Duration::from_millis(parse_number(v).map_err(|_| bad)?);
        }
        "VRANGE_BUDGET" => t.budget = parse_size(v).map_err(|_| bad)?,
        "VRANGE_HEADROOM" => {
            t.headroom = if settings::is_keyword(v, "auto") {
                Headroom::Auto
            } else if settings::is_keyword(v, "off") {
                Headroom::Off
            } else {
                match parse_size(v).map_err(|_| bad)? {
                    0 => Headroom::Off,
                    n => Headroom::Bytes(n),
                }
            }
        }
        "VRANGE_POLL_MS" => {
            t.poll_interval = Duration::from_millis(parse_number(v).map_err(|_| bad)?);
        }
        "VRANGE_PSI" => {
            t.psi = match parse_psi(v).ok_or(bad)? {
                (0, _, _) => None,
                (kind, stall, window) => Some(Psi {
                    full: kind == 2,
                    stall: Duration::from_micros(stall),
                    window: Duration::from_micros(window),
                }),
            }
        }
        "VRANGE_VMPRESSURE" => t.vmpressure = parse_switch(v).ok_or(bad)?,
        "VRANGE_PRESSURE_SHARE" => match parse_number(v) {
            Ok(p @ 1..=100) => t.pressure_share = p as u8,
            _ => return Err(bad),
        },
        _ => return Err(OptionError::UnknownName),
    }
    Ok(())
}

/// `off`, or `some|full STALL_US WINDOW_US` with 0 < stall <= window <= the kernel's maximum.
fn parse_psi(v: &[u8]) -> Option<(u8, u64, u64)> {
    if settings::is_keyword(v, "off") {
        return Some((0, 0, 0));
    }
    let mut it = v
        .split(|b| b.is_ascii_whitespace())
        .filter(|w| !w.is_empty());
    let kind = match it.next()? {
        w if settings::is_keyword(w, "some") => 1,
        w if settings::is_keyword(w, "full") => 2,
        _ => return None,
    };
    let stall = parse_number(it.next()?).ok()?;
    let window = parse_number(it.next()?).ok()?;
    let fits = stall != 0 && stall <= window && window <= PSI_WINDOW_MAX_US;
    (it.next().is_none() && fits).then_some((kind, stall, window))
}

/// Option `name` of a typed configuration, shown in the grammar it is set with (the "using"
/// part of a warning, which the user can paste back).
pub(crate) struct Shown<'a>(pub &'a Config, pub &'a str);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self.0;
        let switch = |on: bool| if on { "on" } else { "off" };
        match self.1 {
            "VRANGE_RECLAIMER" => f.write_str(switch(c.reclaimer)),
            "VRANGE_ARM_DELAY_MS" => write!(f, "{}", millis(c.arm_delay)),
            "VRANGE_BUDGET" => write!(f, "{}", Size(c.budget)),
            "VRANGE_HEADROOM" => match c.headroom {
                Headroom::Auto => f.write_str("auto"),
                Headroom::Off => f.write_str("off"),
                Headroom::Bytes(n) => write!(f, "{}", Size(n)),
            },
            "VRANGE_POLL_MS" => write!(f, "{}", millis(c.poll_interval)),
            "VRANGE_PSI" => match c.psi {
                None => f.write_str("off"),
                Some(p) => write!(
                    f,
                    "{} {} {}",
                    if p.full { "full" } else { "some" },
                    micros(p.stall),
                    micros(p.window)
                ),
            },
            "VRANGE_VMPRESSURE" => f.write_str(switch(c.vmpressure)),
            "VRANGE_PRESSURE_SHARE" => write!(f, "{}", c.pressure_share),
            _ => f.write_str("?"),
        }
    }
}

// ---- The typed form ----

/// The reclaimer and its pressure sources. Fields are public; the struct is `non_exhaustive`,
/// so start from [`Config::current`] (or [`Config::defaults`]) rather than a literal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// Whether the reclaimer thread runs (`VRANGE_RECLAIMER`). Without it only explicit purges
    /// happen, and hybrid marks arm their ranges (nothing else would give them back in time).
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
        snapshot()
    }

    /// This configuration with option `name` (a `VRANGE_*` name, see
    /// [`OPTIONS`]) set from `value` in the environment's grammar.
    ///
    /// # Errors
    /// [`OptionError::UnknownName`], or [`OptionError::InvalidValue`] saying what the option
    /// accepts.
    pub fn with_option(mut self, name: &str, value: &str) -> Result<Config, OptionError> {
        parse(&mut self, name, value.as_bytes())?;
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
        validate(&self)?;
        get();
        store(&self);
        crate::reclaim::config_changed();
        Ok(())
    }

    /// Option `name` of this configuration, in the grammar it is set with (for messages: the
    /// value to show in a warning about a malformed setting). No allocation.
    pub fn show<'a>(&'a self, name: &'a str) -> impl fmt::Display + 'a {
        Shown(self, name)
    }
}

impl Default for Config {
    fn default() -> Config {
        Config::defaults()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Held by the tests that change settings or count changes.
    static SETTINGS: Mutex<()> = Mutex::new(());

    #[test]
    fn every_option_says_what_it_accepts() {
        for name in OPTIONS {
            assert!(accepted(name).is_some(), "{name}");
        }
        assert_eq!(accepted("VRANGE_NOPE"), None);
    }

    #[test]
    fn psi_specs() {
        assert_eq!(
            parse_psi(b"some 100000 2000000"),
            Some((1, 100_000, 2_000_000))
        );
        assert_eq!(parse_psi(b"full 5000 1000000"), Some((2, 5000, 1_000_000)));
        assert_eq!(
            parse_psi(b" Full  5000\t10000000 "),
            Some((2, 5000, 10_000_000))
        );
        assert_eq!(parse_psi(b"off"), Some((0, 0, 0)));
        assert_eq!(parse_psi(b"OFF "), Some((0, 0, 0)));
        assert_eq!(parse_psi(b"some 3 2"), None);
        assert_eq!(parse_psi(b"some 0 2"), None);
        assert_eq!(parse_psi(b"some 1 10000001"), None);
        assert_eq!(parse_psi(b"most 1 2"), None);
        assert_eq!(parse_psi(b"some 1"), None);
        assert_eq!(parse_psi(b"some 1 2 3"), None);
        assert_eq!(parse_psi(b"some 1K 2M"), None);
        assert_eq!(parse_psi(b""), None);
    }

    /// Each default, shown as the warning shows it, reads back as that default: the "using"
    /// part of a warning is a value the user can set.
    #[test]
    fn current_values_read_back() {
        let _one_at_a_time = SETTINGS.lock().unwrap_or_else(|e| e.into_inner());
        for name in OPTIONS {
            let now = snapshot();
            let shown = Shown(&now, name).to_string();
            let mut parsed = now;
            assert_eq!(
                parse(&mut parsed, name, shown.as_bytes()),
                Ok(()),
                "{name}={shown}"
            );
            assert_eq!(parsed, now, "{name}");
            assert_eq!(Shown(&parsed, name).to_string(), shown, "{name}");
        }
    }

    #[test]
    fn unknown_names_and_bad_values_change_nothing() {
        let _one_at_a_time = SETTINGS.lock().unwrap_or_else(|e| e.into_inner());
        // The first use reads the environment and counts as a change: take it first.
        let now = snapshot();
        let before = CONFIG.version.load(Relaxed);
        let mut t = now;
        assert_eq!(
            parse(&mut t, "VRANGE_NOPE", b"1"),
            Err(OptionError::UnknownName)
        );
        for (name, value) in [
            ("VRANGE_RECLAIMER", "maybe"),
            ("VRANGE_ARM_DELAY_MS", "1s"),
            ("VRANGE_ARM_DELAY_MS", "-1"),
            ("VRANGE_BUDGET", "12Q"),
            ("VRANGE_BUDGET", "1.5G"),
            ("VRANGE_HEADROOM", "automatic"),
            ("VRANGE_POLL_MS", ""),
            ("VRANGE_PSI", "some 3 2"),
            ("VRANGE_VMPRESSURE", "maybe"),
            ("VRANGE_PRESSURE_SHARE", "0"),
            ("VRANGE_PRESSURE_SHARE", "101"),
        ] {
            assert_eq!(
                parse(&mut t, name, value.as_bytes()),
                Err(OptionError::InvalidValue {
                    accepted: accepted(name).unwrap()
                }),
                "{name}={value}"
            );
        }
        assert_eq!(CONFIG.version.load(Relaxed), before);
        assert_eq!(t, now, "a refused value changed the parsed settings");
    }
}
