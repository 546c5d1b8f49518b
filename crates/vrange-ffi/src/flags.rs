//! The `flags` of `vrange_alloc` and `vrange_map_shared` and the `priority` of
//! `vrange_set_priority`, decoded into the core's options. The values are the `VRANGE_*` macros
//! of include/vrange.h:
//!
//! | bits  | meaning |
//! |-------|---------|
//! | 0-1   | policy: `VRANGE_HYBRID` (0, default), `VRANGE_LAZY` (1), `VRANGE_MANAGED` (2) |
//! | 2     | `VRANGE_SHARED` |
//! | 3     | reserved |
//! | 4-6   | class: one of `VRANGE_DROP_FIRST`, `_LOW`, `_LAST` at most (none: normal) |
//! | 7     | reserved |
//! | 8-9   | at most one of `VRANGE_NOHUGE`, `VRANGE_HUGE` (none: automatic) |
//! | 10    | `VRANGE_SCRATCH`: a scratch region; no other bit may be set |
//! | 11    | `VRANGE_SIGBUS`: SIGBUS mode |
//! | 12-31 | reserved |
//!
//! Policy 3 is invalid. Reserved bits must be zero: a caller built against a newer header that
//! sets a flag this library does not know gets EINVAL rather than a silently different region.

use libc::c_int;
use vrange_core::{Error, Huge, Options, Policy, Priority};

pub const VRANGE_HYBRID: c_int = 0;
pub const VRANGE_LAZY: c_int = 1;
pub const VRANGE_MANAGED: c_int = 2;
const POLICY_MASK: c_int = 3;
pub const VRANGE_SHARED: c_int = 1 << 2;
pub const VRANGE_DROP_FIRST: c_int = 1 << 4;
pub const VRANGE_DROP_LOW: c_int = 1 << 5;
pub const VRANGE_DROP_LAST: c_int = 1 << 6;
const PRIORITY_MASK: c_int = VRANGE_DROP_FIRST | VRANGE_DROP_LOW | VRANGE_DROP_LAST;
pub const VRANGE_NOHUGE: c_int = 1 << 8;
pub const VRANGE_HUGE: c_int = 1 << 9;
const HUGE_MASK: c_int = VRANGE_NOHUGE | VRANGE_HUGE;
pub const VRANGE_SCRATCH: c_int = 1 << 10;
pub const VRANGE_SIGBUS: c_int = 1 << 11;
pub const VRANGE_CACHE_NO_PROBATION: c_int = 1 << 12;

/// Whether `vrange_alloc(length, flags)` asks for a scratch region.
///
/// # Errors
/// [`Error::BadFlags`] for `VRANGE_SCRATCH` with any other bit (a scratch region has no policy,
/// class or huge-page choice: the kernel alone drops its pages).
pub fn scratch(flags: c_int) -> Result<bool, Error> {
    match flags & VRANGE_SCRATCH {
        0 => Ok(false),
        _ if flags == VRANGE_SCRATCH => Ok(true),
        _ => Err(Error::BadFlags),
    }
}

/// The reclaim class in `flags` (`Normal` when no `VRANGE_DROP_*` bit is set).
///
/// # Errors
/// [`Error::BadFlags`] for two classes at once.
pub fn priority(flags: c_int) -> Result<Priority, Error> {
    match flags & PRIORITY_MASK {
        0 => Ok(Priority::Normal),
        VRANGE_DROP_FIRST => Ok(Priority::DropFirst),
        VRANGE_DROP_LOW => Ok(Priority::Low),
        VRANGE_DROP_LAST => Ok(Priority::DropLast),
        _ => Err(Error::BadFlags),
    }
}

/// The options `vrange_alloc(length, flags)` asks for.
///
/// # Errors
/// [`Error::BadFlags`] for reserved bits, the invalid policy 3 (`VRANGE_LAZY | VRANGE_MANAGED`),
/// two classes or both huge-page bits, and for `VRANGE_SHARED` with `VRANGE_LAZY` or a huge-page
/// bit (shared regions are always managed, and memfd-backed).
pub fn alloc_options(flags: c_int) -> Result<Options, Error> {
    let known = POLICY_MASK | VRANGE_SHARED | PRIORITY_MASK | HUGE_MASK | VRANGE_SIGBUS;
    if flags & !known != 0 {
        return Err(Error::BadFlags);
    }
    let shared = flags & VRANGE_SHARED != 0;
    let sigbus = flags & VRANGE_SIGBUS != 0;
    let policy = match flags & POLICY_MASK {
        VRANGE_HYBRID if shared => Policy::Managed,
        VRANGE_HYBRID => Policy::Hybrid,
        VRANGE_LAZY if !shared => Policy::Lazy,
        VRANGE_MANAGED => Policy::Managed,
        _ => return Err(Error::BadFlags),
    };
    let huge = match flags & HUGE_MASK {
        0 => Huge::Auto,
        VRANGE_NOHUGE if !shared => Huge::Never,
        VRANGE_HUGE if !shared => Huge::Always,
        _ => return Err(Error::BadFlags),
    };
    Ok(Options {
        policy,
        priority: priority(flags)?,
        shared,
        huge,
        sigbus,
    })
}

/// The class and SIGBUS mode `vrange_map_shared(fd, flags, ...)` asks for. `VRANGE_SHARED` and
/// `VRANGE_MANAGED` are accepted (they describe every shared region); nothing else but a
/// `VRANGE_DROP_*` bit and `VRANGE_SIGBUS` is.
///
/// # Errors
/// [`Error::BadFlags`] for any other bit or two classes.
pub fn map_shared_options(flags: c_int) -> Result<Options, Error> {
    if flags & !(PRIORITY_MASK | VRANGE_SHARED | VRANGE_MANAGED | VRANGE_SIGBUS) != 0 {
        return Err(Error::BadFlags);
    }
    Ok(Options {
        priority: priority(flags)?,
        sigbus: flags & VRANGE_SIGBUS != 0,
        ..Options::default()
    })
}

/// The class `vrange_set_priority(..., priority)` sets: 0 (normal) or one `VRANGE_DROP_*` value.
///
/// # Errors
/// [`Error::BadFlags`] for any other value.
pub fn set_priority_value(value: c_int) -> Result<Priority, Error> {
    if value & !PRIORITY_MASK != 0 {
        return Err(Error::BadFlags);
    }
    priority(value)
}
