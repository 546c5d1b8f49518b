//! The standard `process_*` metrics of Prometheus client libraries (CPU time, memory,
//! descriptors, start time), read from `/proc/self` at each scrape through
//! `vrange_sys::procfs`: what an operator's dashboards expect of any exporter. This module only
//! renders; a figure that cannot be read is left out, never made up.

use std::fmt::Write as _;
use vrange_sys::procfs;

/// Appends the `process_*` metrics to `out`.
pub(crate) fn render(out: &mut String) {
    let mut gauge = |name: &str, kind: &str, help: &str, v: Option<f64>| {
        if let Some(v) = v {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}"
            );
        }
    };
    let st = procfs::stat(None).ok();
    let hz = procfs::ticks_per_second().ok();
    gauge(
        "process_cpu_seconds_total",
        "counter",
        "Total user and system CPU time spent in seconds.",
        st.as_ref()
            .and_then(|s| s.utime_ticks.checked_add(s.stime_ticks))
            .zip(hz)
            .map(|(ticks, hz)| ticks as f64 / hz as f64),
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
        st.as_ref().map(|s| s.vsize_bytes as f64),
    );
    gauge(
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since unix epoch in seconds.",
        st.as_ref()
            .zip(hz)
            .zip(procfs::boot_time().ok())
            .map(|((s, hz), boot)| boot as f64 + s.start_ticks as f64 / hz as f64),
    );
    gauge(
        "process_open_fds",
        "gauge",
        "Number of open file descriptors.",
        procfs::open_fds(None).ok().map(|n| n as f64),
    );
    gauge(
        "process_max_fds",
        "gauge",
        "Maximum number of open file descriptors.",
        procfs::open_files_limit(None)
            .ok()
            .and_then(|l| l.soft)
            .map(|n| n as f64),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_process_metric_is_rendered() {
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
