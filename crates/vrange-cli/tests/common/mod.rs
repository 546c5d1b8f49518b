//! What the `vrange` command's integration tests share: the command with a clean environment,
//! and `libvrange_malloc.so` for `vrange run --lib`.
#![allow(dead_code)] // each test file uses its own subset

#[path = "../../../vrange-malloc/support/shim.rs"]
mod shim;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The `vrange` executable, without the `VRANGE_*` variables of the test's own environment.
pub fn vrange() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_vrange"));
    // The tests decide the environment.
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("VRANGE_") {
            c.env_remove(k);
        }
    }
    c
}

/// `libvrange_malloc.so`, built once per test process.
pub fn lib() -> &'static Path {
    static SO: OnceLock<PathBuf> = OnceLock::new();
    SO.get_or_init(|| shim::build_shim(&shim::target_dir()).unwrap_or_else(|e| panic!("{e}")))
}
