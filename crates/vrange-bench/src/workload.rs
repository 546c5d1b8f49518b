//! The C workloads of the suites (`crates/vrange-bench/c`), compiled into the output directory.
//! Processes, cgroups and hogs are vrange-testkit's.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Writes `source` as `dir/name.c` and compiles it to `dir/name` with `$CC` (default gcc).
pub fn compile(dir: &Path, name: &str, source: &str) -> Result<PathBuf, String> {
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).map_err(|e| format!("write {}: {e}", src.display()))?;
    let exe = dir.join(name);
    let cc = std::env::var("CC")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .unwrap_or_else(|| "gcc".into());
    let out = Command::new(&cc)
        .args(["-O2", "-pthread", "-Wall", "-Wextra", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .map_err(|e| format!("cannot run {cc} (install gcc or set CC): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "compiling {} failed:\n{}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(exe)
}
