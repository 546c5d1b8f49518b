//! /proc/PID/stat and /proc/PID/task/TID/stat: a process's (or one thread's) state, faults,
//! CPU time, start time and sizes, in the kernel's units (clock ticks, pages).

use super::{malformed, read};
use std::io;

/// The fields of /proc/PID/stat that vrange reads (proc(5) numbers them from 1).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// Field 3: `R` running, `S` sleeping, `D` in uninterruptible wait, `Z` zombie, `T`
    /// stopped, `t` traced, `I` idle kernel thread...
    pub state: char,
    /// Field 10: faults that needed no I/O.
    pub minor_faults: u64,
    /// Field 12: faults that read a page in.
    pub major_faults: u64,
    /// Field 14: CPU time in user mode, in clock ticks ([`ticks_per_second`]).
    pub utime_ticks: u64,
    /// Field 15: CPU time in kernel mode, in clock ticks.
    pub stime_ticks: u64,
    /// Field 22: when the process started, in clock ticks after boot. With the pid, it names
    /// one process even after pids are reused.
    pub start_ticks: u64,
    /// Field 23: virtual size in bytes.
    pub vsize_bytes: u64,
    /// Field 24: resident set size in pages.
    pub rss_pages: u64,
}

/// /proc/PID/stat of process `pid` (this process if `None`); faults and times are summed over
/// its threads.
///
/// # Errors
/// As the module says; `InvalidData` for text without the fields above.
pub fn stat(pid: Option<u32>) -> io::Result<Stat> {
    parse_stat(&read(pid, "stat")?)
}

/// /proc/PID/task/TID/stat: thread `tid` of process `pid` (this process if `None`) alone.
///
/// # Errors
/// As [`stat`].
pub fn task_stat(pid: Option<u32>, tid: u32) -> io::Result<Stat> {
    parse_stat(&read(pid, &format!("task/{tid}/stat"))?)
}

/// When process `pid` (this process if `None`) started, in clock ticks after boot.
///
/// # Errors
/// As [`stat`].
pub fn start_ticks(pid: Option<u32>) -> io::Result<u64> {
    stat(pid).map(|s| s.start_ticks)
}

/// Clock ticks per second, the unit of the times in /proc (sysconf `_SC_CLK_TCK`).
///
/// # Errors
/// The errno of sysconf(3), or EINVAL if it answers no positive number.
pub fn ticks_per_second() -> io::Result<u64> {
    // SAFETY: sysconf only reads a constant of the C library.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    match u64::try_from(hz) {
        Ok(hz) if hz > 0 => Ok(hz),
        _ if hz < 0 => Err(io::Error::last_os_error()),
        _ => Err(io::Error::from_raw_os_error(libc::EINVAL)),
    }
}

/// Parses /proc/PID/stat text.
///
/// # Errors
/// `InvalidData` when a field above is missing or not a number.
pub fn parse_stat(text: &str) -> io::Result<Stat> {
    // The command name (field 2) may hold spaces and parentheses: count from its last ')'.
    let rest = text
        .rfind(')')
        .map(|i| &text[i + 1..])
        .ok_or_else(|| malformed("stat: no command name"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let word = |n: usize| {
        fields
            .get(n - 3)
            .copied()
            .ok_or_else(|| malformed("stat: too few fields"))
    };
    let number = |n: usize| -> io::Result<u64> {
        word(n)?
            .parse()
            .map_err(|_| malformed("stat: a field is not a number"))
    };
    let mut state = word(3)?.chars();
    let (Some(state), None) = (state.next(), state.next()) else {
        return Err(malformed("stat: state"));
    };
    Ok(Stat {
        state,
        minor_faults: number(10)?,
        major_faults: number(12)?,
        utime_ticks: number(14)?,
        stime_ticks: number(15)?,
        start_ticks: number(22)?,
        vsize_bytes: number(23)?,
        rss_pages: number(24)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_after_a_name_with_parentheses() {
        let s = parse_stat(
            "42 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23\n",
        )
        .unwrap();
        assert_eq!(
            s,
            Stat {
                state: 'S',
                minor_faults: 7,
                major_faults: 9,
                utime_ticks: 11,
                stime_ticks: 12,
                start_ticks: 19,
                vsize_bytes: 20,
                rss_pages: 21,
            }
        );
    }

    #[test]
    fn real_looking_stat() {
        let text = "4242 (sleep) S 4241 4242 4241 34816 4242 4194304 97 0 0 0 0 0 0 0 20 0 1 \
                    0 123456 5582848 252 18446744073709551615 94558005223424 94558005241049 \
                    140722768493280 0 0 0 0 0 0 1 0 0 17 1 0 0 0 0 0\n";
        let s = parse_stat(text).unwrap();
        assert_eq!((s.state, s.minor_faults, s.start_ticks), ('S', 97, 123456));
        assert_eq!((s.vsize_bytes, s.rss_pages), (5582848, 252));
    }

    #[test]
    fn short_or_garbled_stat_is_invalid_data() {
        for bad in [
            "",
            "42 (x",
            "42 (x) S 1 2",
            "42 (x) S 1 2 3 4 5 6 a 8 9 10 11 12 13 14 15 16 17 18 19 20 21",
            "42 (x) SS 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21",
        ] {
            let e = parse_stat(bad).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{bad:?}");
        }
    }

    #[test]
    fn real_stat() {
        let own = stat(None).unwrap();
        assert!(own.vsize_bytes > 0 && own.rss_pages > 0, "{own:?}");
        let pid = std::process::id();
        assert_eq!(start_ticks(Some(pid)).unwrap(), own.start_ticks);
        // This thread runs while it reads its own stat.
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as u32;
        let this = task_stat(None, tid).unwrap();
        assert_eq!(this.state, 'R', "{this:?}");
        // A thread's faults are some of the process's.
        assert!(this.minor_faults <= stat(None).unwrap().minor_faults);
        assert!(ticks_per_second().unwrap() > 0);
    }
}
