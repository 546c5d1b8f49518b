//! Why something the kernel could offer is not available to this process: the errno it
//! answered (when it was an answer) and what a person should read.

use std::fmt;
use std::io;

/// Why a feature or an operation is not available here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unavailable {
    /// The errno behind it, when the kernel answered one (EPERM, EACCES, ENOSYS, EINVAL...).
    pub errno: Option<i32>,
    /// In words: "not permitted for uid 1000", "needs CAP_SYS_PTRACE or ...".
    pub reason: String,
}

impl Unavailable {
    /// A reason that is no errno (a missing file's meaning, a rule of the kernel's).
    pub fn because(reason: impl Into<String>) -> Unavailable {
        Unavailable {
            errno: None,
            reason: reason.into(),
        }
    }

    /// The error `e`, in words, with its errno: "not permitted for uid N" for a permission
    /// error, else the error without Rust's "(os error N)".
    pub fn from_io(e: &io::Error) -> Unavailable {
        let reason = match e.raw_os_error() {
            Some(libc::EPERM | libc::EACCES) => {
                format!("not permitted for uid {}", crate::statsdir::effective_uid())
            }
            _ => crate::statsdir::plain(e),
        };
        Unavailable {
            errno: e.raw_os_error(),
            reason,
        }
    }

    /// `context: ` before the reason.
    pub fn within(mut self, context: impl fmt::Display) -> Unavailable {
        self.reason = format!("{context}: {}", self.reason);
        self
    }
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason)
    }
}

impl std::error::Error for Unavailable {}
