//! `Entry`: a value handed to a reader, pinned while the guard lives; `Held`: a value kept for
//! long, holding only its own pages.

use crate::slab::Slab;
use std::ptr::NonNull;
use std::sync::Arc;

/// What a value in a reader's hands offers, the same for both kinds: `$t` has fields `ptr` and
/// `len` (bytes inside its slab) and a `priority()`, and keeps those bytes mapped and unpurged
/// while it lives (an `Entry` by its pin on the slab, a `Held` by its hold on their pages).
macro_rules! reader_value {
    ($t:ident) => {
        // SAFETY: a pin or hold on a slab (whose operations are thread-safe, and which the
        // value keeps alive) and a pointer to bytes no one writes again while it lasts.
        unsafe impl Send for $t {}
        // SAFETY: as above; `&$t` only reads.
        unsafe impl Sync for $t {}

        impl std::fmt::Debug for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($t))
                    .field("len", &self.len)
                    .field("priority", &self.priority())
                    .finish()
            }
        }

        impl std::ops::Deref for $t {
            type Target = [u8];

            fn deref(&self) -> &[u8] {
                // SAFETY: `ptr..ptr+len` lies inside the slab, and the value keeps those bytes
                // mapped and unpurged while it lives; slabs never reuse space, so no one
                // writes them meanwhile.
                unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
            }
        }

        impl AsRef<[u8]> for $t {
            fn as_ref(&self) -> &[u8] {
                self
            }
        }
    };
}

reader_value!(Entry);
reader_value!(Held);

/// A cached value, pinned: it derefs to the bytes, which cannot be purged while the entry
/// lives, and stays readable even if the key is removed or replaced meanwhile. Dropping it lets
/// the system take the value's slab back again (once no other entry of the slab is held).
///
/// An entry pins the value's whole slab (256 KiB by default) with two atomic operations: it is
/// the guard for reading a value now. To keep a value for long, [`Entry::hold`] it: a
/// [`Held`] value keeps only its own pages from a purge.
pub struct Entry {
    /// Alive while the entry's pin lasts: a pinned slab holds a reference to itself.
    slab: NonNull<Slab>,
    ptr: *const u8,
    len: usize,
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

    /// The value's offset in its slab.
    fn offset(&self) -> usize {
        self.ptr as usize - self.slab().start()
    }

    /// Keeps the value for long: the returned [`Held`] keeps the value's own pages (its bytes
    /// rounded out to pages) from any purge, while the rest of its slab becomes volatile again
    /// once no entry pins it. Costs a lock on the slab here and at the drop.
    pub fn hold(self) -> Held {
        let slab = self.slab();
        slab.hold(self.offset(), self.len);
        Held {
            // A pinned slab is alive, so `arc` finds it.
            slab: slab.arc().expect("a pinned slab is alive"),
            ptr: self.ptr,
            len: self.len,
        }
        // `self` drops its pin here: the hold keeps the value.
    }

    /// Gives the value up as its address and length, held (as [`Entry::hold`]: only its own
    /// pages are kept from a purge), for a caller that cannot keep a guard (the C ABI).
    /// Release it with [`crate::Cache::release_raw`] on the cache it came from, once per
    /// `into_raw`: the cache remembers each raw value by its exact address, so releasing an
    /// address it did not give out raw (or more often than it did) fails and drops no one's
    /// hold.
    pub fn into_raw(self) -> (*const u8, usize) {
        let held = self.hold();
        let raw = (held.ptr, held.len);
        held.slab
            .shared()
            .raw_given(held.ptr as usize, held.len, held.slab.clone());
        std::mem::forget(held);
        raw
    }
}

/// A cached value kept for long ([`Entry::hold`]): it derefs to the bytes, which cannot be
/// purged while it lives, and stays readable even if the key is removed or replaced, or the
/// rest of its slab is purged. Only the pages the value lies on are kept; dropping it lets the
/// system take them back.
pub struct Held {
    slab: Arc<Slab>,
    ptr: *const u8,
    len: usize,
}

impl Held {
    /// The value's class.
    pub fn priority(&self) -> vrange::Priority {
        self.slab.priority
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let off = self.ptr as usize - self.slab.start();
        self.slab.release_hold(off, self.len);
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        self.slab().unpin();
    }
}
