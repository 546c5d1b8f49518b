//! `Entry`: a value handed to a reader, pinned while the guard lives.

use crate::slab::Slab;
use std::ptr::NonNull;

/// A cached value, pinned: it derefs to the bytes, which cannot be purged while the entry
/// lives, and stays readable even if the key is removed or replaced meanwhile. Dropping it lets
/// the system take the value's slab back again (once no other entry of the slab is held).
pub struct Entry {
    /// Alive while the entry's pin lasts: a pinned slab holds a reference to itself.
    slab: NonNull<Slab>,
    ptr: *const u8,
    len: usize,
}

// SAFETY: the entry is a pin on a slab (whose operations are thread-safe, and which the pin
// keeps alive) and a pointer to bytes no one writes again while the slab lives.
unsafe impl Send for Entry {}
// SAFETY: as above; `&Entry` only reads.
unsafe impl Sync for Entry {}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("len", &self.len)
            .field("priority", &self.slab().priority)
            .finish()
    }
}

impl Entry {
    /// An entry for a pin the caller took on `slab`; `ptr` and `len` lie inside it.
    pub(crate) fn pinned(slab: &Slab, ptr: *const u8, len: usize) -> Entry {
        Entry {
            slab: NonNull::from(slab),
            ptr,
            len,
        }
    }

    fn slab(&self) -> &Slab {
        // SAFETY: the entry holds a pin, and a pinned slab holds a reference to itself
        // (`slab.rs`): it lives at least until `Drop` below drops the pin.
        unsafe { self.slab.as_ref() }
    }

    /// The value's class.
    pub fn priority(&self) -> vrange::Priority {
        self.slab().priority
    }

    /// Gives the value up as its address and length, still pinned, for a caller that cannot
    /// hold the guard (the C ABI). Release it with [`crate::Cache::release_raw`] on the cache
    /// it came from, once per `into_raw`: the cache remembers each raw value by its exact
    /// address, so releasing an address it did not give out raw (or more often than it did)
    /// fails and drops no one's pin.
    pub fn into_raw(self) -> (*const u8, usize) {
        let slab = self.slab();
        // A pinned slab is alive, so `arc` finds it.
        if let Some(arc) = slab.arc() {
            slab.shared().raw_given(self.ptr as usize, arc);
        }
        let raw = (self.ptr, self.len);
        std::mem::forget(self);
        raw
    }
}

impl std::ops::Deref for Entry {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` lies inside the slab, which this entry holds (mapped) and pins
        // (not purged); slabs never reuse space, so no one writes these bytes meanwhile.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl AsRef<[u8]> for Entry {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        self.slab().unpin();
    }
}
