//! **Internal to vrange; no stability promise. Use the `vrange` crate.**
//!
//! The kernel boundary: every `mmap`, `madvise`, `ioctl`, descriptor and `/proc` access of
//! vrange lives in this crate, and no other crate calls them (`clippy.toml` enforces it). The
//! core (`vrange`), the allocator and the command build on it; it depends on nothing of theirs.
//!
//! # Contract
//! - Addresses passed to the memory functions are page-aligned and lengths are multiples of the
//!   page size; callers check this first (the core's `span`). Violations are reported, not
//!   fixed.
//! - Errors: every fallible system call returns `io::Result` (an errno, never allocated on the
//!   async-signal-safe paths); the core turns it into `vrange::Error` at one edge, where the
//!   context is known. A probe that finds a feature missing says why with
//!   [`unavailable::Unavailable`] (the errno, if any, and a reason); settings and poll sets have
//!   typed errors of their own (`settings::ParseSizeError`, `pressure::AddError`). Outcomes that
//!   are not failures are values (`vma::Coverage`).
//! - What content survives each call, named by guarantee rather than by flag:
//!
//! | function            | advice                | content afterwards                          |
//! |---------------------|-----------------------|---------------------------------------------|
//! | [`mem::purge_lazy`]   | MADV_FREE           | kept until memory pressure; then zero pages |
//! | [`mem::purge_forced`] | MADV_DONTNEED       | zero at once; page tables freed with PT_RECLAIM when a 2 MiB block is covered |
//! | [`mem::reclaim_now`]  | MADV_PAGEOUT        | clean lazy pages discarded now; dirty pages kept (no swap) or swapped |
//! | [`mem::populate_write`] | MADV_POPULATE_WRITE | kept; missing pages faulted in writable   |
//! | [`mem::advise_huge`]  | MADV_(NO)HUGEPAGE   | kept                                        |
//!
//! - Functions marked async-signal-safe make only system calls, never allocate and never lock:
//!   [`mem::page_size`] after first use, [`vma::check_private_anon`], [`pagemap::huge_runs`],
//!   [`pressure::Waker::wake`], [`uffd::copy`], [`uffd::zero`], [`uffd::move_pages`],
//!   [`uffd::unregister`], [`pid::identity`].
//! - Kernel features are probed by [`probe`]; the core calls each probe once and reports the
//!   answers and fallbacks (`vrange::features()`).
//!
//! # Safety
//! This is one of the modules allowed `unsafe`: each block names the check it relies on.

// The one place allowed to call the raw memory syscalls (see clippy.toml).
#![allow(clippy::disallowed_methods)]

pub mod cgroup;
pub mod clock;
pub mod fd;
pub mod futex;
pub mod lock;
pub mod mem;
pub mod own_table;
pub mod pagemap;
pub mod pid;
pub mod pressure;
pub mod probe;
pub mod process;
pub mod procfs;
pub mod settings;
pub mod shm;
pub mod sock;
pub mod statsdir;
pub mod sync;
pub mod uffd;
pub mod unavailable;
pub mod vma;
