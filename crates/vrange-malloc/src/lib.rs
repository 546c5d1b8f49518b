//! vrange-malloc: an allocator whose free memory is volatile.
//!
//! Large blocks (at or above a threshold, 64 KiB by default) are carved from 2 MiB chunks, and
//! every free span is a volatile range: freeing a block marks it volatile in O(1) (one atomic
//! operation, no system call), reusing it unmarks it. Free memory stays resident and is reused
//! at the speed of dirty memory, yet the reclaimer purges it, oldest first, when the process
//! comes under pressure; a fully free chunk is purged with one MADV_DONTNEED over its whole PMD,
//! so the kernel frees its page table too. Purged pages read as zero, so `calloc` does not
//! clear them again. Small requests go to the system allocator.
//!
//! ```no_run
//! #[global_allocator]
//! static A: vrange_malloc::VrangeMalloc = vrange_malloc::VrangeMalloc;
//! ```
//!
//! For any other program, `LD_PRELOAD=target/release/libvrange_malloc.so` (the
//! `vrange-malloc-preload` package) interposes the malloc family.
//!
//! # Safety
//! `unsafe` is confined to the metadata structures (chunk lists and records under their locks)
//! and the entry points that take caller pointers; each block names the check it relies on.

#![deny(unsafe_op_in_unsafe_fn)]

mod arena;
mod cache;
pub mod chunk;
mod chunkmap;
pub mod config;
mod global;
pub mod heap;
mod large;
mod ranges;
mod stats;

pub use config::{MallocMode, Thp};
pub use global::VrangeMalloc;
pub use heap::{report, Block};
pub use stats::print_summary;
