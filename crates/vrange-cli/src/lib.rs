//! What the `vrange` command prints with, shared with `vrange-bench` (the benchmark suites, an
//! unpublished crate that depends on this one): the printing that never panics on a closed
//! pipe, aligned tables, and times. Not an API: no stability promise beyond the command's.

#![deny(unsafe_op_in_unsafe_fn)]

#[macro_use]
pub mod print;

pub mod clock;
pub mod table;
