//! Reclaimer settings: read once from `VRANGE_*` environment variables, changeable at run time
//! with [`set_option`] under the same names. Stored in atomics, so the mark path (budget) and
//! the reclaimer thread read them without locking.
//!
//! | variable               | default              | meaning |
//! |------------------------|----------------------|---------|
//! | `VRANGE_RECLAIMER`     | `on`                 | `off`: no reclaimer thread (only explicit purges, and the kernel for hybrid ranges once armed; arming needs the thread) |
//! | `VRANGE_ARM_DELAY_MS`  | `1000`               | hybrid ranges volatile this long are handed to the kernel path |
//! | `VRANGE_BUDGET`        | `0` (none)           | resident volatile bytes allowed before the oldest are purged (`K`/`M`/`G` suffixes) |
//! | `VRANGE_HEADROOM`      | `auto`               | purge when the cgroup's limit minus usage falls below this; `auto` = limit/16 within [4 MiB, 256 MiB]; `off` |
//! | `VRANGE_POLL_MS`       | `100`                | how often headroom, budget and arming are checked |
//! | `VRANGE_PSI`           | `some 100000 2000000`| PSI trigger (kind, stall µs, window µs) on the system and cgroup v2 files; `off` |
//! | `VRANGE_VMPRESSURE`    | `on`                 | cgroup v1 memory.pressure_level medium and critical events; `off` |
//! | `VRANGE_PRESSURE_SHARE`| `25`                 | percent of volatile bytes purged per PSI or medium event (critical purges all) |

use crate::Error;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8};
use std::sync::Once;

/// `VRANGE_HEADROOM=auto`.
pub(crate) const HEADROOM_AUTO: u64 = u64::MAX;

pub(crate) struct Config {
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

static CONFIG: Config = Config {
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

/// The settings, with the environment applied on first use.
pub(crate) fn get() -> &'static Config {
    static ENV: Once = Once::new();
    ENV.call_once(|| {
        for name in OPTIONS {
            if let Some(value) = std::env::var_os(name) {
                // A malformed variable keeps the default; say so once rather than fail the
                // program that happens to link vrange.
                let ok = value.to_str().map(|v| apply(name, v).is_ok()) == Some(true);
                if !ok {
                    eprintln!("vrange: ignoring malformed {name}={value:?}");
                }
            }
        }
    });
    &CONFIG
}

/// Sets one option by its environment-variable name, e.g. `set_option("VRANGE_BUDGET", "64M")`.
///
/// # Errors
/// [`Error::BadFlags`] for an unknown name or a malformed value; nothing changes then.
pub fn set_option(name: &str, value: &str) -> Result<(), Error> {
    get();
    apply(name, value)?;
    crate::reclaim::config_changed();
    Ok(())
}

fn apply(name: &str, value: &str) -> Result<(), Error> {
    let c = &CONFIG;
    let v = value.trim();
    match name {
        "VRANGE_RECLAIMER" => c.enabled.store(parse_switch(v)?, Relaxed),
        "VRANGE_ARM_DELAY_MS" => c.arm_delay_ms.store(parse_u64(v)?, Relaxed),
        "VRANGE_BUDGET" => c.budget.store(parse_size(v)?, Relaxed),
        "VRANGE_HEADROOM" => c.headroom.store(
            match v {
                "auto" => HEADROOM_AUTO,
                "off" => 0,
                _ => parse_size(v)?,
            },
            Relaxed,
        ),
        "VRANGE_POLL_MS" => c.poll_ms.store(parse_u64(v)?.max(1), Relaxed),
        "VRANGE_PSI" => {
            let (kind, stall, window) = parse_psi(v)?;
            c.psi_kind.store(kind, Relaxed);
            c.psi_stall_us.store(stall, Relaxed);
            c.psi_window_us.store(window, Relaxed);
        }
        "VRANGE_VMPRESSURE" => c.vmpressure.store(parse_switch(v)?, Relaxed),
        "VRANGE_PRESSURE_SHARE" => match parse_u64(v)? {
            p @ 1..=100 => c.pressure_share.store(p, Relaxed),
            _ => return Err(Error::BadFlags),
        },
        _ => return Err(Error::BadFlags),
    }
    c.version.fetch_add(1, Relaxed);
    Ok(())
}

fn parse_switch(v: &str) -> Result<bool, Error> {
    match v {
        "on" | "1" | "yes" | "true" => Ok(true),
        "off" | "0" | "no" | "false" => Ok(false),
        _ => Err(Error::BadFlags),
    }
}

fn parse_u64(v: &str) -> Result<u64, Error> {
    v.parse().map_err(|_| Error::BadFlags)
}

/// Bytes with an optional `K`, `M`, `G` or `T` suffix (powers of 1024; `KiB` spellings too).
pub(crate) fn parse_size(v: &str) -> Result<u64, Error> {
    let v = v.trim();
    let digits = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (n, unit) = v.split_at(digits);
    let n: u64 = n.parse().map_err(|_| Error::BadFlags)?;
    let shift = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return Err(Error::BadFlags),
    };
    n.checked_mul(1 << shift).ok_or(Error::BadFlags)
}

fn parse_psi(v: &str) -> Result<(u8, u64, u64), Error> {
    if v == "off" {
        return Ok((0, 0, 0));
    }
    let mut it = v.split_whitespace();
    let kind = match it.next() {
        Some("some") => 1,
        Some("full") => 2,
        _ => return Err(Error::BadFlags),
    };
    let stall = parse_u64(it.next().ok_or(Error::BadFlags)?)?;
    let window = parse_u64(it.next().ok_or(Error::BadFlags)?)?;
    if it.next().is_some() || stall == 0 || stall > window {
        return Err(Error::BadFlags);
    }
    Ok((kind, stall, window))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64M"), Ok(64 << 20));
        assert_eq!(parse_size("2 GiB"), Ok(2 << 30));
        assert_eq!(parse_size("3k"), Ok(3 << 10));
        assert_eq!(parse_size("M"), Err(Error::BadFlags));
        assert_eq!(parse_size("12Q"), Err(Error::BadFlags));
        assert_eq!(parse_size("99999999999999T"), Err(Error::BadFlags));
    }

    #[test]
    fn psi_specs() {
        assert_eq!(
            parse_psi("some 100000 2000000"),
            Ok((1, 100_000, 2_000_000))
        );
        assert_eq!(parse_psi("full 5000 1000000"), Ok((2, 5000, 1_000_000)));
        assert_eq!(parse_psi("off"), Ok((0, 0, 0)));
        assert_eq!(parse_psi("some 3 2"), Err(Error::BadFlags));
        assert_eq!(parse_psi("most 1 2"), Err(Error::BadFlags));
        assert_eq!(parse_psi("some 1"), Err(Error::BadFlags));
    }

    #[test]
    fn unknown_names_and_bad_values_change_nothing() {
        let before = CONFIG.version.load(Relaxed);
        assert_eq!(apply("VRANGE_NOPE", "1"), Err(Error::BadFlags));
        assert_eq!(apply("VRANGE_PRESSURE_SHARE", "0"), Err(Error::BadFlags));
        assert_eq!(apply("VRANGE_VMPRESSURE", "maybe"), Err(Error::BadFlags));
        assert_eq!(CONFIG.version.load(Relaxed), before);
    }
}
