//! Locating the workspace and building `libvrange_malloc.so`, shared by the integration tests
//! (`tests/common`) and the benchmarks (`benches/`), which include this file with `#[path]`.
//! Cargo builds no cdylib for a test or a bench, hence the nested `cargo build`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace root (this crate is `crates/vrange-malloc`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/vrange-malloc lies two levels below the workspace root")
        .to_path_buf()
}

/// The target directory this executable was built into: a test or bench executable is
/// `<target>/[<triple>/]<profile>/deps/<name>-<hash>`, and cargo marks the target directory
/// with a `CACHEDIR.TAG`. Falls back to `CARGO_TARGET_DIR`, then to `<root>/target`.
pub fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("this executable's path");
    if let Some(dir) = exe
        .ancestors()
        .skip(3)
        .take(2)
        .find(|d| d.join("CACHEDIR.TAG").exists())
    {
        return dir.to_path_buf();
    }
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => repo_root().join(dir),
        None => repo_root().join("target"),
    }
}

/// Builds `libvrange_malloc.so` with `cargo build --release -p vrange-malloc-preload` into
/// `target` (a no-op when it is up to date) and returns its path.
pub fn build_shim(target: &Path) -> Result<PathBuf, String> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(&cargo);
    cmd.args(["build", "--release", "-p", "vrange-malloc-preload"])
        .arg("--manifest-path")
        .arg(repo_root().join("Cargo.toml"))
        .arg("--target-dir")
        .arg(target);
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {}: {e}", cargo.to_string_lossy()))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed ({})\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let so = target.join("release/libvrange_malloc.so");
    if so.exists() {
        Ok(so)
    } else {
        Err(format!("{cmd:?} did not produce {}", so.display()))
    }
}
