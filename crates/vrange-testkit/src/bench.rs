//! What the criterion benchmarks share: size labels, and reading this run's medians back to
//! print them side by side.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const GIB: usize = 1 << 30;

/// "4KiB", "2MiB", "1GiB": the benchmark id parameter.
pub fn size_label(size: usize) -> String {
    if size >= GIB {
        format!("{}GiB", size / GIB)
    } else if size >= MIB {
        format!("{}MiB", size / MIB)
    } else {
        format!("{}KiB", size / KIB)
    }
}

/// Where criterion writes its results, found the way criterion finds it (CRITERION_HOME, then
/// CARGO_TARGET_DIR, then the target directory this executable was built into).
pub fn criterion_dir() -> Option<PathBuf> {
    if let Some(home) = std::env::var_os("CRITERION_HOME") {
        return Some(PathBuf::from(home));
    }
    if let Some(target) = std::env::var_os("CARGO_TARGET_DIR") {
        return Some(PathBuf::from(target).join("criterion"));
    }
    // <target>/<profile>/deps/<bench>-<hash>
    let exe = std::env::current_exe().ok()?;
    Some(exe.ancestors().nth(3)?.join("criterion"))
}

/// The median (ns per iteration) of benchmark `group/method/label`, if criterion wrote it
/// during this run (after `since`).
pub fn fresh_median(
    dir: &Path,
    group: &str,
    method: &str,
    label: &str,
    since: SystemTime,
) -> Option<f64> {
    let path = dir
        .join(group.replace('/', "_"))
        .join(method)
        .join(label)
        .join("new")
        .join("estimates.json");
    if std::fs::metadata(&path).ok()?.modified().ok()? < since {
        return None;
    }
    let text = std::fs::read_to_string(&path).ok()?;
    let median = &text[text.find("\"median\":")?..];
    let value = &median[median.find("\"point_estimate\":")? + "\"point_estimate\":".len()..];
    let end = value.find([',', '}'])?;
    value[..end].trim().parse().ok()
}

/// "1.23 µs": three significant digits and a unit.
pub fn format_ns(ns: f64) -> String {
    let (v, unit) = if ns >= 1e6 {
        (ns / 1e6, "ms")
    } else if ns >= 1e3 {
        (ns / 1e3, "µs")
    } else {
        (ns, "ns")
    };
    let digits = if v >= 100.0 {
        0
    } else if v >= 10.0 {
        1
    } else {
        2
    };
    format!("{v:.digits$} {unit}")
}
