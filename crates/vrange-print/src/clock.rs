//! Local wall-clock time for what the commands print: the HH:MM:SS column of `vrange stat
//! --watch`, and the date on vrange-bench's plots. Local, not UTC: a person compares it with
//! the clock on their screen and with their own logs.

use std::time::{SystemTime, UNIX_EPOCH};

/// A local date and time, to the second.
pub struct Local {
    year: i32,
    month: u32,
    day: u32,
    hour: u32,
    minute: u32,
    second: u32,
}

impl Local {
    pub fn now() -> Local {
        Local::at(SystemTime::now())
    }

    /// `t` in the local time zone (the TZ variable, else /etc/localtime, as libc decides).
    pub fn at(t: SystemTime) -> Local {
        let secs = t
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as libc::time_t);
        // SAFETY: all-zero bytes are a valid `tm` (integers and a null zone pointer).
        let mut tm: libc::tm = unsafe { std::mem::zeroed() };
        // SAFETY: both pointers refer to live locals; localtime_r is the thread-safe form and
        // writes only `tm`. On failure `tm` stays zero, which prints as a harmless 1900-01-00.
        unsafe { libc::localtime_r(&secs, &mut tm) };
        Local {
            year: tm.tm_year + 1900,
            month: (tm.tm_mon + 1) as u32,
            day: tm.tm_mday as u32,
            hour: tm.tm_hour as u32,
            minute: tm.tm_min as u32,
            second: tm.tm_sec as u32,
        }
    }

    /// "2026-05-02".
    pub fn date(&self) -> String {
        format!("{:04}-{:02}-{:02}", self.year, self.month, self.day)
    }

    /// "14:03:59".
    pub fn time(&self) -> String {
        format!("{:02}:{:02}:{:02}", self.hour, self.minute, self.second)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_fixed_width() {
        let t = Local::now();
        let (d, h) = (t.date(), t.time());
        assert_eq!(d.len(), 10, "{d}");
        assert_eq!(&d[4..5], "-");
        assert_eq!(h.len(), 8, "{h}");
        assert!(h.chars().filter(|c| *c == ':').count() == 2, "{h}");
        assert!(t.year >= 2024, "{d}");
    }
}
