//! Typed errors of the core, each with the errno that madvise(2) would give for the same input.

use std::fmt;

/// Why a vrange operation refused its input or failed.
///
/// Every variant maps to one errno ([`Error::errno`]) so the C ABI can report it the way
/// madvise(2) does. Nothing is marked, unmarked or lost when an operation returns an error,
/// except where a variant's documentation says otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// `start` is not page-aligned (EINVAL).
    Unaligned,
    /// `start + length`, rounded up to a page, overflows the address space (EINVAL).
    Overflow,
    /// The mode argument is not one of the defined modes (EINVAL; C ABI only).
    BadMode,
    /// Part of the range is not mapped (ENOMEM).
    NotMapped,
    /// The range is mapped but not private, anonymous, readable and writable memory, so the
    /// kernel purge path cannot serve it (EINVAL). Shared, file-backed, read-only and
    /// `PROT_NONE` memory land here, and scratch memory, which is always volatile.
    Unsupported,
    /// The kernel refused the purge hint for part of the range, for example because it is
    /// locked with mlock(2) (EINVAL). The range was pinned again before returning.
    Refused,
    /// The range lies above the highest user address vrange tracks (EINVAL).
    OutOfReach,
    /// The range covers part of a library-owned region and memory outside it (EINVAL).
    Straddles,
    /// A shared region's reclaim class is set for the whole region in each mapping; the range
    /// covers only part of it (EINVAL).
    Partial,
    /// The address and length do not name a region returned by `VolatileRegion::new` or
    /// `vrange_alloc` (EINVAL).
    NotRegion,
    /// Unknown or contradictory flags, option names or option values (EINVAL).
    BadFlags,
    /// Any other failure of a system call, with its errno.
    Os(i32),
}

impl Error {
    /// The errno madvise(2) would report for the same condition.
    pub fn errno(self) -> i32 {
        match self {
            Error::Unaligned
            | Error::Overflow
            | Error::BadMode
            | Error::Unsupported
            | Error::Refused
            | Error::OutOfReach
            | Error::Straddles
            | Error::Partial
            | Error::NotRegion
            | Error::BadFlags => libc::EINVAL,
            Error::NotMapped => libc::ENOMEM,
            Error::Os(e) => e,
        }
    }

    /// The error for a purge hint the kernel refused (madvise(2)'s errno in context): a hole
    /// is [`Error::NotMapped`], EINVAL (locked or otherwise unadvisable memory) is
    /// [`Error::Refused`].
    pub(crate) fn from_advice(e: std::io::Error) -> Error {
        match e.raw_os_error() {
            Some(libc::ENOMEM) => Error::NotMapped,
            Some(libc::EINVAL) => Error::Refused,
            _ => Error::from(e),
        }
    }
}

/// The one edge where the OS layer's errors become vrange's: the errno, as it is. Callers that
/// know the context map particular errnos first (madvise(2)'s ENOMEM and EINVAL in the range calls).
impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::Os(e.raw_os_error().unwrap_or(libc::EIO))
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self {
            Error::Unaligned => "start address is not page-aligned",
            Error::Overflow => "range overflows the address space",
            Error::BadMode => "unknown vrange mode",
            Error::NotMapped => "range is not fully mapped",
            Error::Unsupported => {
                "range is not private anonymous read-write memory (shared, file-backed, protected or scratch)"
            }
            Error::Refused => "kernel refused the purge hint (locked memory?)",
            Error::OutOfReach => "range lies above the addresses vrange tracks",
            Error::Straddles => "range straddles the boundary of a vrange region",
            Error::Partial => "a shared region's class is set whole",
            Error::NotRegion => "not a region allocated by vrange",
            Error::BadFlags => "unknown or contradictory flags or options",
            Error::Os(_) => "system call failed",
        };
        write!(f, "{what} (errno {})", self.errno())
    }
}

impl std::error::Error for Error {}

/// Shorthand for results of this crate.
pub type Result<T> = std::result::Result<T, Error>;

/// Why [`set_option`](crate::set_option) refused a setting. Nothing changed then.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OptionError {
    /// No option has this name (the names are [`OPTIONS`](crate::reclaim::OPTIONS)).
    UnknownName,
    /// The value does not follow the option's grammar or lies outside its range; `accepted`
    /// says what the option takes.
    InvalidValue {
        /// The option's grammar, e.g. `"a percentage from 1 to 100"`.
        accepted: &'static str,
    },
}

impl OptionError {
    /// The errno of the C ABI's `vrange_set_option`: always EINVAL.
    pub fn errno(self) -> i32 {
        libc::EINVAL
    }
}

impl fmt::Display for OptionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OptionError::UnknownName => f.write_str("unknown option"),
            OptionError::InvalidValue { accepted } => {
                write!(f, "invalid value (expected {accepted})")
            }
        }
    }
}

impl std::error::Error for OptionError {}

impl From<OptionError> for Error {
    fn from(_: OptionError) -> Error {
        Error::BadFlags
    }
}
