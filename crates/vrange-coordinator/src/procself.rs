//! The standard `process_*` metrics of Prometheus client libraries (CPU time, memory,
//! descriptors, start time), read from `/proc/self` at each scrape: what an operator's
//! dashboards expect of any exporter. A figure that cannot be read is left out, never made up.

use std::fmt::Write as _;

/// `/proc/self/stat` fields after the command name: (utime, stime, starttime) in clock ticks,
/// vsize in bytes, rss in pages.
struct Stat {
    cpu_ticks: u64,
    start_ticks: u64,
    vsize: u64,
    rss_pages: u64,
}

fn stat(text: &str) -> Option<Stat> {
    // The command name may hold spaces and parentheses: the fields start after the last ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 3 (state) onwards: utime is field 14, stime 15, starttime 22, vsize 23, rss 24.
    let n = |field: usize| f.get(field - 3)?.parse::<u64>().ok();
    Some(Stat {
        cpu_ticks: n(14)?.checked_add(n(15)?)?,
        start_ticks: n(22)?,
        vsize: n(23)?,
        rss_pages: n(24)?,
    })
}

/// The soft limit on open files from `/proc/self/limits` (`None` for unlimited).
fn max_fds(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Boot time in seconds since the epoch, from `/proc/stat`.
fn boot_time(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))?
        .trim()
        .parse()
        .ok()
}

fn clock_ticks() -> Option<u64> {
    // SAFETY: sysconf only reads a constant of the C library.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(hz).ok().filter(|&hz| hz > 0)
}

/// Appends the `process_*` metrics to `out`.
pub(crate) fn render(out: &mut String) {
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let mut gauge = |name: &str, kind: &str, help: &str, v: Option<f64>| {
        if let Some(v) = v {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        }
    };
    let st = read("/proc/self/stat").and_then(|t| stat(&t));
    let hz = clock_ticks();
    gauge(
        "process_cpu_seconds_total",
        "counter",
        "Total user and system CPU time spent in seconds.",
        st.as_ref()
            .zip(hz)
            .map(|(s, hz)| s.cpu_ticks as f64 / hz as f64),
    );
    gauge(
        "process_resident_memory_bytes",
        "gauge",
        "Resident memory size in bytes.",
        st.as_ref()
            .map(|s| s.rss_pages as f64 * vrange_sys::mem::page_size() as f64),
    );
    gauge(
        "process_virtual_memory_bytes",
        "gauge",
        "Virtual memory size in bytes.",
        st.as_ref().map(|s| s.vsize as f64),
    );
    gauge(
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since unix epoch in seconds.",
        st.as_ref()
            .zip(hz)
            .zip(read("/proc/stat").and_then(|t| boot_time(&t)))
            .map(|((s, hz), boot)| boot as f64 + s.start_ticks as f64 / hz as f64),
    );
    gauge(
        "process_open_fds",
        "gauge",
        "Number of open file descriptors.",
        std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|d| d.count() as f64),
    );
    gauge(
        "process_max_fds",
        "gauge",
        "Maximum number of open file descriptors.",
        read("/proc/self/limits")
            .and_then(|t| max_fds(&t))
            .map(|n| n as f64),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_files_parse() {
        let s =
            stat("42 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21").unwrap();
        assert_eq!(s.cpu_ticks, 11 + 12);
        assert_eq!(s.start_ticks, 19);
        assert_eq!(s.vsize, 20);
        assert_eq!(s.rss_pages, 21);
        let limits = "Limit Soft Limit Hard Limit Units\nMax open files            1024                 524288               files\n";
        assert_eq!(max_fds(limits), Some(1024));
        assert_eq!(
            boot_time("cpu 1 2\nbtime 1700000000\n"),
            Some(1_700_000_000)
        );
        let mut out = String::new();
        render(&mut out);
        for name in [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_virtual_memory_bytes",
            "process_start_time_seconds",
            "process_open_fds",
            "process_max_fds",
        ] {
            assert!(out.contains(&format!("\n{name} ")), "{name}: {out}");
        }
    }
}
