//! What vrange's commands print with: the `vrange` command (vrange-cli) and the benchmark
//! suites (vrange-bench, unpublished) alike, so that neither depends on the other: the printing
//! that never panics on a closed pipe, aligned tables, and times. It knows nothing of volatile
//! memory and depends on no crate of vrange's. Not an API: no stability promise beyond the
//! command's.

// ci: host only: formatting

#![deny(unsafe_op_in_unsafe_fn)]

#[macro_use]
pub mod print;

pub mod clock;
pub mod table;
