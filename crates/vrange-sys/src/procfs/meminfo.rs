//! /proc/meminfo and /proc/vmstat: the machine's memory and its memory-management counters.

use super::field_line;
use std::io;

/// The value of line `field` (without its colon, e.g. "MemAvailable") of /proc/meminfo, or
/// `None` if the kernel has no such line. The unit is KiB except for the `HugePages_` counts.
///
/// # Errors
/// The errno of reading /proc/meminfo.
pub fn meminfo_kb(field: &str) -> io::Result<Option<u64>> {
    Ok(parse_meminfo(
        &crate::fd::read_file("/proc/meminfo")?,
        field,
    ))
}

/// MemTotal and MemAvailable of /proc/meminfo in KiB, from one read (`None` before Linux 3.14,
/// which has no MemAvailable).
///
/// # Errors
/// The errno of reading /proc/meminfo.
pub fn mem_available_kb() -> io::Result<Option<(u64, u64)>> {
    let text = crate::fd::read_file("/proc/meminfo")?;
    Ok(parse_meminfo(&text, "MemTotal").zip(parse_meminfo(&text, "MemAvailable")))
}

/// Counter `name` of /proc/vmstat (system-wide, since boot), such as `pglazyfreed`, or `None`
/// if this kernel has no such counter.
///
/// # Errors
/// The errno of reading /proc/vmstat.
pub fn vmstat(name: &str) -> io::Result<Option<u64>> {
    Ok(parse_vmstat(&crate::fd::read_file("/proc/vmstat")?, name))
}

/// The value of line `field` of /proc/meminfo text.
pub fn parse_meminfo(text: &str, field: &str) -> Option<u64> {
    text.lines()
        .filter_map(field_line)
        .find(|&(name, _)| name == field)
        .map(|(_, v)| v)
}

/// Counter `name` of /proc/vmstat text ("name value" lines).
pub fn parse_vmstat(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == name).then(|| v.trim().parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_lines() {
        let text = "MemTotal:       16318480 kB\nMemFree:         1203388 kB\n\
                    MemAvailable:   10254964 kB\nHugePages_Total:       4\n";
        assert_eq!(parse_meminfo(text, "MemAvailable"), Some(10254964));
        assert_eq!(parse_meminfo(text, "HugePages_Total"), Some(4));
        assert_eq!(parse_meminfo(text, "MemFre"), None);
    }

    #[test]
    fn vmstat_lines() {
        let text = "nr_free_pages 300847\npglazyfree 1024\npglazyfreed 96\n";
        assert_eq!(parse_vmstat(text, "pglazyfreed"), Some(96));
        assert_eq!(parse_vmstat(text, "pglazyfree"), Some(1024));
        assert_eq!(parse_vmstat(text, "pglazy"), None);
    }

    #[test]
    fn real_meminfo_and_vmstat() {
        assert!(meminfo_kb("MemTotal").unwrap().unwrap() > 0);
        assert_eq!(meminfo_kb("NoSuchField").unwrap(), None);
        let (total, avail) = mem_available_kb().unwrap().unwrap();
        assert!(avail <= total && total > 0);
        assert!(vmstat("pgfault").unwrap().unwrap() > 0);
        assert_eq!(vmstat("no_such_counter").unwrap(), None);
    }
}
