//! What vrange-bench's integration tests share: the command with a clean environment.

use std::process::Command;
use vrange_testkit::proc::without_vrange_env;

/// The `vrange-bench` executable, without the `VRANGE_*` variables of the test's own
/// environment (the suites decide the settings of what they measure).
pub fn vrange_bench() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_vrange-bench"));
    without_vrange_env(&mut c);
    c
}
