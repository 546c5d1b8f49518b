//! What the `vrange` command's integration tests share: the command with a clean environment,
//! and `libvrange_malloc.so` for `vrange run --lib`.
#![allow(dead_code)] // each test file uses its own subset

use std::process::Command;
use vrange_testkit::proc::without_vrange_env;

/// `libvrange_malloc.so`, built once per test process (the command itself never builds it).
#[allow(unused_imports)] // each test file uses its own subset
pub use vrange_testkit::build::shim as lib;

/// The `vrange` executable, without the `VRANGE_*` variables of the test's own environment.
pub fn vrange() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_vrange"));
    // The tests decide the environment.
    without_vrange_env(&mut c);
    c
}
