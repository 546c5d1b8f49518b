//! `vrange bench`: the classic experiments, with the peers measured in the same run.

use std::path::Path;

/// The suites, in the order `all` runs them.
pub const SUITES: [&str; 5] = ["ebizzy", "pressure", "lazyfree", "pagetable", "markcost"];

pub fn main(suite: &str, quick: bool, out: &Path) -> i32 {
    let _ = (quick, out);
    if suite != "all" && !SUITES.contains(&suite) {
        eprintln!(
            "vrange bench: unknown suite {suite:?} (one of {}, all)",
            SUITES.join(", ")
        );
        return 2;
    }
    eprintln!("vrange bench {suite}: not implemented yet");
    1
}
