//! /proc/PID/limits and /proc/PID/fd: a process's resource limits and its open descriptors.

use super::{malformed, path, read};
use std::io;

/// One resource limit; `None` stands for `unlimited`.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// The soft limit, the one enforced.
    pub soft: Option<u64>,
    /// The hard limit, the ceiling of the soft one.
    pub hard: Option<u64>,
}

/// The limit on open files (`RLIMIT_NOFILE`) of process `pid` (this process if `None`).
///
/// # Errors
/// As the module says; `InvalidData` when the file has no such line.
pub fn open_files_limit(pid: Option<u32>) -> io::Result<Limit> {
    parse_limit(&read(pid, "limits")?, "Max open files")
        .ok_or_else(|| malformed("limits: no Max open files line"))
}

/// How many descriptors process `pid` (this process if `None`) has open: the entries of
/// /proc/PID/fd. For this process the count includes the descriptor that lists them.
///
/// # Errors
/// The errno of opening or reading the directory.
pub fn open_fds(pid: Option<u32>) -> io::Result<usize> {
    let mut n = 0;
    for entry in std::fs::read_dir(path(pid, "fd"))? {
        entry?;
        n += 1;
    }
    Ok(n)
}

/// The limit named `name` ("Max open files", as the file's first column spells it) in
/// /proc/PID/limits text, or `None` without such a line.
pub fn parse_limit(text: &str, name: &str) -> Option<Limit> {
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?;
        // "Max processes" must not match "Max processes ever" were there one.
        if !rest.starts_with(char::is_whitespace) {
            return None;
        }
        let mut words = rest.split_whitespace();
        let mut value = || match words.next()? {
            "unlimited" => Some(None),
            n => n.parse().ok().map(Some),
        };
        Some(Limit {
            soft: value()?,
            hard: value()?,
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: &str = "\
Limit                     Soft Limit           Hard Limit           Units
Max cpu time              unlimited            unlimited            seconds
Max file size             unlimited            unlimited            bytes
Max processes             127569               127569               processes
Max open files            1024                 524288               files
Max locked memory         8388608              8388608              bytes
Max address space         unlimited            unlimited            bytes
";

    #[test]
    fn limits_lines() {
        assert_eq!(
            parse_limit(LIMITS, "Max open files"),
            Some(Limit {
                soft: Some(1024),
                hard: Some(524288),
            })
        );
        assert_eq!(
            parse_limit(LIMITS, "Max cpu time"),
            Some(Limit {
                soft: None,
                hard: None,
            })
        );
        assert_eq!(parse_limit(LIMITS, "Max open"), None);
        assert_eq!(parse_limit(LIMITS, "Max nice priority"), None);
    }

    #[test]
    fn real_limits_and_descriptors() {
        let mut lim: libc::rlimit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: lim is a valid out-parameter.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        let want = |v: libc::rlim_t| (v != libc::RLIM_INFINITY).then_some(v);
        assert_eq!(
            open_files_limit(None).unwrap(),
            Limit {
                soft: want(lim.rlim_cur),
                hard: want(lim.rlim_max),
            }
        );
        // Other tests of this binary may close theirs meanwhile, never these.
        let held: Vec<_> = (0..8)
            .map(|_| std::fs::File::open("/proc/self/status").unwrap())
            .collect();
        assert!(open_fds(Some(std::process::id())).unwrap() > held.len());
    }
}
