//! The atomics and the wait primitive the range state machine uses, in one place so that the
//! loom model (`tests/loom_state.rs`) can compile `state.rs` against loom's versions instead.

pub(crate) use std::sync::atomic;

// Shared with the allocator's locks; the loom model supplies its own.
pub(crate) use vrange_sys::sync::backoff;
