//! The real [`Ranges`] backend: free spans become `vrange::OwnedRange`s, which the reclaimer
//! ages, arms and purges. Which policy a span gets follows the mode, and in hybrid mode keeps
//! arming (MADV_FREE) from splitting a huge page: on chunks that may be backed by huge pages,
//! only a whole free chunk is handed to the kernel; smaller free spans stay managed.

use crate::chunk::Ranges;
use crate::config::MallocMode;
use vrange::{Content, OwnedRange, Policy, Priority, Taken};

/// Free spans as volatile ranges, for one chunk's operations.
pub struct Volatile {
    pub mode: MallocMode,
    /// The chunk may be backed by huge pages.
    pub huge: bool,
}

impl Volatile {
    /// The backend for the current settings.
    pub fn current() -> Volatile {
        Volatile {
            mode: crate::config::mode(),
            huge: crate::config::thp() == crate::config::Thp::Always,
        }
    }

    /// The range with a non-zero id (0 means "no range": every operation on it is a no-op).
    fn range(id: u32) -> OwnedRange {
        debug_assert_ne!(id, 0);
        // SAFETY: every non-zero id the chunk code passes came from `create` (into_raw) and is
        // rebuilt once per operation, then given back with into_raw or consumed.
        unsafe { OwnedRange::from_raw(id) }
    }
}

impl Ranges for Volatile {
    fn create(&mut self, start: usize, len: usize, content: Content, policy: Policy) -> u32 {
        if self.mode == MallocMode::Lazy {
            // The kernel alone decides: free spans are not registered (see `freed`).
            return 0;
        }
        // SAFETY: the chunk code registers only free spans of chunks the allocator maps and
        // never unmaps; it takes them back before handing their bytes out.
        let made = unsafe { OwnedRange::new(start, len, policy, Priority::Normal, content) };
        made.map_or(0, |mut r| {
            // Chunks are mapped with this advice and nothing else (`arena.rs`): a purge may
            // replace whole chunks, freeing their page tables on any kernel.
            r.set_thp_advice(self.huge);
            r.into_raw()
        })
    }

    fn take(&mut self, id: u32) -> Taken {
        if id == 0 {
            return Taken::default();
        }
        Self::range(id).take()
    }

    fn take_tail(&mut self, id: u32, len: usize) -> Taken {
        if id == 0 {
            return Taken::default();
        }
        let mut r = Self::range(id);
        let t = r.take_tail(len);
        r.into_raw();
        t
    }

    fn grow(&mut self, id: u32, start: usize, len: usize) {
        if id == 0 {
            return;
        }
        let mut r = Self::range(id);
        // SAFETY: the chunk code grows a free span only over the block just freed and free
        // spans next to it, all inside the chunk.
        unsafe { r.grow(start, len) };
        r.into_raw();
    }

    fn absorb(&mut self, id: u32, other: u32) {
        if id == 0 || other == 0 {
            return;
        }
        let mut r = Self::range(id);
        r.absorb(Self::range(other));
        r.into_raw();
    }

    fn set_policy(&mut self, id: u32, policy: Policy) {
        if id == 0 {
            return;
        }
        let mut r = Self::range(id);
        r.set_policy(policy);
        r.into_raw();
    }

    fn freed(&mut self, start: usize, len: usize) {
        if self.mode == MallocMode::Lazy {
            // SAFETY: the block was just freed: its owner gave up the content.
            let _ = unsafe { vrange_sys::mem::purge_lazy(start as *mut u8, len) };
        }
    }

    fn policy(&self, _pages: usize, whole_chunk: bool) -> Policy {
        match self.mode {
            MallocMode::Lazy => Policy::Lazy,
            MallocMode::Hybrid if whole_chunk || !self.huge => Policy::Hybrid,
            MallocMode::Hybrid | MallocMode::Managed | MallocMode::Off => Policy::Managed,
        }
    }
}
