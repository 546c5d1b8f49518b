//! The allocator's settings, read once from `VRANGE_MALLOC_*` variables with `getenv` (no
//! allocation: the shim may be configured before anything else in the process runs).
//!
//! Values follow vrange's one grammar (`vrange_sys::settings`): sizes are decimal bytes with an
//! optional unit, `K`, `KB`, `KiB`, `M`, ... `TiB` in any case, all powers of 1024; switches are
//! `on`/`off`, `yes`/`no`, `true`/`false`, `1`/`0`; keywords are in any case. A malformed value
//! is reported once, in one line on stderr naming the variable, what it accepts and the value
//! used instead, and the default is used:
//! `vrange: VRANGE_MALLOC_MODE=bogus is not valid (hybrid, managed, lazy, off); using hybrid`.
//!
//! | variable                     | default  | meaning                                            |
//! |------------------------------|----------|----------------------------------------------------|
//! | `VRANGE_MALLOC_THRESHOLD`    | `64K`    | smallest request served, a size; smaller ones go to the system allocator. Below `16K` it is raised to `16K`, with the warning |
//! | `VRANGE_MALLOC_MODE`         | `hybrid` | `hybrid`, `managed`, `lazy` (MADV_FREE at every free) or `off` |
//! | `VRANGE_MALLOC_THP`          | `auto`   | `auto`: a large block's whole 2 MiB pages ask for huge pages where THP allows; `always`: chunks too; `never` |
//! | `VRANGE_MALLOC_ARM_DELAY_MS` | core's   | sets `VRANGE_ARM_DELAY_MS` (hybrid: idle time before free memory goes to the kernel's lazy-free path) |
//! | `VRANGE_MALLOC_BUDGET`       | core's   | sets `VRANGE_BUDGET`, a size (resident free bytes kept before the oldest are purged) |
//! | `VRANGE_MALLOC_STATS`        | `off`    | a switch: `on` prints a summary to stderr at exit  |

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize};
use vrange_sys::settings::{
    is_keyword, parse_size, parse_switch, var, warn, Size, SIZE_GRAMMAR, SWITCH_GRAMMAR,
};

/// How free memory is handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MallocMode {
    /// Free spans are managed volatile ranges; idle ones are handed to the kernel's lazy-free
    /// path after the arm delay (whole chunks only where huge pages back them).
    Hybrid,
    /// Free spans are managed volatile ranges, purged only by the reclaimer.
    Managed,
    /// Every free advises the freed pages with MADV_FREE (the kernel alone decides).
    Lazy,
    /// The allocator serves nothing: every request goes to the system allocator.
    Off,
}

impl MallocMode {
    /// The mode's name in `VRANGE_MALLOC_MODE`.
    pub fn name(self) -> &'static str {
        match self {
            MallocMode::Hybrid => "hybrid",
            MallocMode::Managed => "managed",
            MallocMode::Lazy => "lazy",
            MallocMode::Off => "off",
        }
    }
}

/// Which memory asks the kernel for transparent huge pages (`VRANGE_MALLOC_THP`).
///
/// A huge page is faulted in whole at the first touch of any of its bytes, so memory backed by
/// one costs 2 MiB however little of it is used. `Auto` asks for huge pages only where they
/// are used whole: the 2 MiB pages that lie inside a large block's requested bytes. Chunks
/// hold blocks that rarely fill them (two 683 KiB blocks leave a third free; one block of
/// 1 MiB + 1 leaves half) and stay on small pages, so the live footprint matches glibc's for
/// every block size; `Always` gives chunks huge pages too (one fault per chunk, fewer TLB
/// misses) at up to twice the memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Thp {
    /// No huge pages.
    Never,
    /// Huge pages for the whole 2 MiB pages of large blocks.
    Auto,
    /// Huge pages for chunks and large blocks.
    Always,
}

impl Thp {
    /// The setting's name in `VRANGE_MALLOC_THP`.
    pub fn name(self) -> &'static str {
        match self {
            Thp::Never => "never",
            Thp::Auto => "auto",
            Thp::Always => "always",
        }
    }
}

/// Smallest threshold accepted. Below it the allocator could be entered by the small
/// allocations vrange itself makes while it holds locks (thread creation, reports).
pub const MIN_THRESHOLD: usize = 16 << 10;
/// The default threshold.
pub const DEFAULT_THRESHOLD: usize = 64 << 10;

static THRESHOLD: AtomicUsize = AtomicUsize::new(DEFAULT_THRESHOLD);
static MODE: AtomicU8 = AtomicU8::new(0);
static THP: AtomicU8 = AtomicU8::new(Thp::Auto as u8);
static STATS: AtomicBool = AtomicBool::new(false);
/// 0: not read, 1: reading, 2: read.
static READ: AtomicU8 = AtomicU8::new(0);

/// What `VRANGE_MALLOC_THRESHOLD` accepts.
const THRESHOLD_GRAMMAR: &str = "a size of at least 16K, such as 64K or 1MiB";

/// Reads the environment once. Safe to call from any thread at any time; a thread that races
/// the first read sees the defaults until it is done. Runs inside the process's first large
/// `malloc`: it allocates nothing, and reports a malformed variable with
/// [`vrange_sys::settings::warn`] (one line, written with write(2) from the stack).
pub fn init() {
    if READ.load(Acquire) == 2 || READ.compare_exchange(0, 1, Acquire, Relaxed).is_err() {
        return;
    }
    let name = "VRANGE_MALLOC_THRESHOLD";
    if let Some(v) = var(name) {
        match parse_size(v) {
            Ok(n) if n >= MIN_THRESHOLD as u64 => {
                THRESHOLD.store(usize::try_from(n).unwrap_or(usize::MAX), Relaxed);
            }
            // Raised to the minimum, and said so: the program asked for blocks to be served
            // that will not be, and nothing else would tell it.
            Ok(_) => {
                warn(name, v, THRESHOLD_GRAMMAR, &Size(MIN_THRESHOLD as u64));
                THRESHOLD.store(MIN_THRESHOLD, Relaxed);
            }
            Err(_) => warn(name, v, THRESHOLD_GRAMMAR, &Size(threshold() as u64)),
        }
    }
    let name = "VRANGE_MALLOC_MODE";
    if let Some(v) = var(name) {
        match [
            MallocMode::Hybrid,
            MallocMode::Managed,
            MallocMode::Lazy,
            MallocMode::Off,
        ]
        .into_iter()
        .find(|m| is_keyword(v, m.name()))
        {
            Some(m) => set_mode(m),
            None => warn(name, v, "hybrid, managed, lazy, off", &mode().name()),
        }
    }
    let name = "VRANGE_MALLOC_THP";
    if let Some(v) = var(name) {
        match [Thp::Auto, Thp::Always, Thp::Never]
            .into_iter()
            .find(|t| is_keyword(v, t.name()))
        {
            Some(t) => set_thp(t),
            None => warn(name, v, "auto, always, never", &thp().name()),
        }
    }
    let name = "VRANGE_MALLOC_STATS";
    if let Some(v) = var(name) {
        match parse_switch(v) {
            Some(on) => STATS.store(on, Relaxed),
            None => warn(name, v, SWITCH_GRAMMAR, &"off"),
        }
    }
    init_core();
    READ.store(2, Release);
}

/// Reads the core's settings, once, after ours ([`init`]): the core's own variables
/// (`Config::current` reads them once, so that every warning comes now), and ours that set the
/// core's options of the same meaning (a malformed one is reported under our name, with the
/// value the option keeps). No allocation: values are parsed from the environment's bytes,
/// never copied into a String.
fn init_core() {
    let core = vrange::Config::current();
    for (ours, option) in [
        ("VRANGE_MALLOC_ARM_DELAY_MS", "VRANGE_ARM_DELAY_MS"),
        ("VRANGE_MALLOC_BUDGET", "VRANGE_BUDGET"),
    ] {
        let Some(v) = var(ours) else { continue };
        let changed = std::str::from_utf8(v)
            .map_err(|_| vrange::OptionError::InvalidValue {
                accepted: if option == "VRANGE_BUDGET" {
                    SIZE_GRAMMAR
                } else {
                    "milliseconds"
                },
            })
            .and_then(|text| vrange::Config::current().with_option(option, text));
        match changed.and_then(vrange::Config::apply) {
            Ok(()) => {}
            Err(vrange::OptionError::InvalidValue { accepted }) => {
                warn(ours, v, accepted, &core.show(option));
            }
            Err(_) => debug_assert!(false, "{option} is an option"),
        }
    }
}

/// The smallest request the allocator serves.
#[inline]
pub fn threshold() -> usize {
    THRESHOLD.load(Relaxed)
}

/// Sets the threshold (at least [`MIN_THRESHOLD`]).
pub fn set_threshold(bytes: usize) {
    THRESHOLD.store(bytes.max(MIN_THRESHOLD), Relaxed);
}

/// The mode.
#[inline]
pub fn mode() -> MallocMode {
    match MODE.load(Relaxed) {
        0 => MallocMode::Hybrid,
        1 => MallocMode::Managed,
        2 => MallocMode::Lazy,
        _ => MallocMode::Off,
    }
}

/// Sets the mode for free spans created from now on.
pub fn set_mode(mode: MallocMode) {
    MODE.store(mode as u8, Relaxed);
}

/// Which memory asks for transparent huge pages.
#[inline]
pub fn thp() -> Thp {
    match THP.load(Relaxed) {
        0 => Thp::Never,
        1 => Thp::Auto,
        _ => Thp::Always,
    }
}

/// Sets which memory asks for huge pages, for chunks and large blocks mapped from now on.
pub fn set_thp(thp: Thp) {
    THP.store(thp as u8, Relaxed);
}

/// Whether a summary is printed at exit.
pub fn stats_at_exit() -> bool {
    STATS.load(Relaxed)
}
