//! Caches: `vrange_cache_create`, `vrange_cache_put`, `vrange_cache_get`,
//! `vrange_cache_release`, `vrange_cache_remove`, `vrange_cache_stats`, `vrange_cache_destroy`,
//! over `vrange_cache::Cache` with byte-string keys.

use crate::{flags, guard};
use libc::{c_int, c_void, size_t};
use std::mem::ManuallyDrop;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::{null, null_mut};
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use vrange_cache::{Cache, ClassStats, Miss, Options};
use vrange_core::{Error, Policy};

/// Set in every live cache handle and cleared on destroy.
const MAGIC: u64 = 0x7672_6361_6368_6531; // "vrcache1"

/// `struct vrange_cache` (opaque in C).
///
/// A destroyed handle is never freed: `vrange_cache_destroy` drops the cache and clears the
/// magic, but keeps these 16 bytes, so that any later call with the handle reads a cleared
/// magic and fails with EINVAL (as vrange.h promises) instead of reading freed memory, and
/// the address is never handed to another cache. The price is 16 bytes per destroyed cache.
pub struct VrangeCache {
    magic: AtomicU64,
    /// Dropped (only) by `vrange_cache_destroy`, after it clears `magic`.
    cache: ManuallyDrop<Box<Cache<Box<[u8]>>>>,
}

/// `struct vrange_cache_options` of include/vrange.h.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct VrangeCacheOptions {
    pub size: u64,
    pub slab_bytes: u64,
    pub budget: u64,
    pub flags: u64,
}

/// `struct vrange_cache_class_stats` of include/vrange.h.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct VrangeCacheClassStats {
    pub hits: u64,
    pub inserts: u64,
    pub purged_lookups: u64,
    pub purged_entries: u64,
    pub purged_bytes: u64,
    pub resident_bytes: u64,
    pub value_bytes: u64,
    pub slabs: u64,
}

/// `struct vrange_cache_stats` of include/vrange.h. Later versions only append fields.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct VrangeCacheStats {
    pub size: u64,
    pub entries: u64,
    pub hits: u64,
    pub misses: u64,
    pub purged_lookups: u64,
    pub resident_bytes: u64,
    pub value_bytes: u64,
    pub overhead_bytes: u64,
    pub purged_bytes: u64,
    pub dropped_purged: u64,
    pub classes: [VrangeCacheClassStats; 4],
    // Appended after the first release (older callers pass a smaller size and do not get them).
    pub mapped_bytes: u64,
    pub pinned_bytes: u64,
    pub promoted: [u64; 4],
    pub recycled: [u64; 4],
    pub carried: [u64; 4],
}

const _: () = assert!(std::mem::size_of::<VrangeCacheOptions>() == 8 * 4);
const _: () = assert!(std::mem::size_of::<VrangeCacheStats>() == 8 * (10 + 4 * 8 + 2 + 4 + 4 + 4));

impl From<&ClassStats> for VrangeCacheClassStats {
    fn from(c: &ClassStats) -> Self {
        VrangeCacheClassStats {
            hits: c.hits,
            inserts: c.inserts,
            purged_lookups: c.purged_lookups,
            purged_entries: c.purged_entries,
            purged_bytes: c.purged_bytes,
            resident_bytes: c.resident_bytes,
            value_bytes: c.value_bytes,
            slabs: c.slabs,
        }
    }
}

fn to_options(o: &VrangeCacheOptions) -> Result<Options, Error> {
    let no_probation = flags::VRANGE_CACHE_NO_PROBATION as u64;
    let policy = match o.flags & !no_probation {
        0 => Policy::Hybrid,
        f if f == flags::VRANGE_MANAGED as u64 => Policy::Managed,
        _ => return Err(Error::BadFlags),
    };
    let defaults = Options::default();
    Ok(Options {
        slab_bytes: match o.slab_bytes {
            0 => defaults.slab_bytes,
            n => usize::try_from(n).map_err(|_| Error::Overflow)?,
        },
        policy,
        budget: match o.budget {
            0 => None,
            n => Some(usize::try_from(n).map_err(|_| Error::Overflow)?),
        },
        probation: o.flags & no_probation == 0,
    })
}

/// The cache behind a C handle (EINVAL for NULL or a destroyed handle).
///
/// # Safety
/// `c` must be NULL or a pointer from `vrange_cache_create` (destroyed or not: a destroyed
/// handle stays readable, see [`VrangeCache`]), not being destroyed by another thread.
unsafe fn cache<'a>(c: *const VrangeCache) -> Result<&'a Cache<Box<[u8]>>, Error> {
    // SAFETY: forwarded: NULL or a handle from vrange_cache_create, whose memory is never
    // freed; its cache is dropped only after the magic is cleared.
    match unsafe { c.as_ref() } {
        Some(h) if h.magic.load(Relaxed) == MAGIC => Ok(&h.cache),
        _ => Err(Error::BadFlags),
    }
}

/// `len` bytes at `p` (NULL only for `len == 0`). [`Error::Overflow`] for a length no object
/// can have (above `isize::MAX`), before any slice is made of it.
///
/// # Safety
/// `p` must be readable for `len` bytes when not NULL.
unsafe fn bytes<'a>(p: *const c_void, len: size_t) -> Result<&'a [u8], Error> {
    if isize::try_from(len).is_err() {
        return Err(Error::Overflow);
    }
    if p.is_null() {
        return if len == 0 {
            Ok(&[])
        } else {
            Err(Error::BadFlags)
        };
    }
    // SAFETY: forwarded: readable for len bytes.
    Ok(unsafe { std::slice::from_raw_parts(p.cast(), len) })
}

/// Creates a cache (`options` may be NULL: the defaults). Returns it, or NULL with errno.
///
/// # Safety
/// `options` must be NULL or point to at least `options->size` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn vrange_cache_create(
    options: *const VrangeCacheOptions,
) -> *mut VrangeCache {
    guard(null_mut(), || {
        let mut o = VrangeCacheOptions::default();
        // SAFETY: forwarded: NULL or readable.
        if let Some(given) = unsafe { options.as_ref() } {
            let size = given.size as usize;
            if size < std::mem::size_of::<u64>() * 2 {
                return Err(Error::BadFlags);
            }
            let n = size.min(std::mem::size_of::<VrangeCacheOptions>());
            // SAFETY: the caller's struct holds `size` bytes; we copy the ones we know.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    options.cast::<u8>(),
                    (&mut o as *mut VrangeCacheOptions).cast::<u8>(),
                    n,
                )
            };
        }
        let cache = Cache::try_new(to_options(&o)?)?;
        Ok(Box::into_raw(Box::new(VrangeCache {
            magic: AtomicU64::new(MAGIC),
            cache: ManuallyDrop::new(Box::new(cache)),
        })))
    })
}

/// Destroys a cache. Values still held (not released) stay readable and are leaked. The
/// handle's own 16 bytes stay allocated, so that later calls with it fail with EINVAL.
///
/// # Safety
/// `c` must be NULL or a handle from `vrange_cache_create`; no other thread may use it
/// during the call.
#[no_mangle]
pub unsafe extern "C" fn vrange_cache_destroy(c: *mut VrangeCache) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: forwarded: NULL or a handle from vrange_cache_create (never freed).
        if unsafe { cache(c) }.is_ok() {
            // SAFETY: a live handle no other thread uses now (the contract): cleared first,
            // so that every later call (a second destroy too) is refused, then the cache is
            // dropped once. The handle itself is never freed (see VrangeCache).
            unsafe {
                (*c).magic.store(0, Relaxed);
                ManuallyDrop::drop(&mut (*c).cache);
            }
        }
    }));
}

/// Inserts a copy of `val` under `key` with class `priority` (0 or a `VRANGE_DROP_*` value).
/// Returns 0 or -1 with errno.
///
/// # Safety
/// `c` NULL or a handle from `vrange_cache_create` (a destroyed one is refused); `key` and `val` readable for their lengths.
#[no_mangle]
pub unsafe extern "C" fn vrange_cache_put(
    c: *mut VrangeCache,
    key: *const c_void,
    klen: size_t,
    val: *const c_void,
    vlen: size_t,
    priority: c_int,
) -> c_int {
    guard(-1, || {
        // A size no memory can hold (a key or value longer than any object, a value too
        // large for the address space) is ENOMEM, as malloc(3) says for SIZE_MAX.
        let absurd = |e| match e {
            Error::Overflow => Error::Os(libc::ENOMEM),
            e => e,
        };
        // SAFETY: forwarded contract.
        let (cache, key, val) = unsafe {
            (
                cache(c)?,
                bytes(key, klen).map_err(absurd)?,
                bytes(val, vlen).map_err(absurd)?,
            )
        };
        let priority = flags::set_priority_value(priority)?;
        cache
            .insert(Box::from(key), val, priority)
            .map_err(absurd)?;
        Ok(0)
    })
}

/// The value under `key`, pinned until `vrange_cache_release`, its length in `*vlen`; NULL
/// with errno ENOENT (absent) or ESTALE (purged; the entry is dropped).
///
/// # Safety
/// `c` NULL or a handle from `vrange_cache_create` (a destroyed one is refused); `key` readable for `klen`; `vlen` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vrange_cache_get(
    c: *mut VrangeCache,
    key: *const c_void,
    klen: size_t,
    vlen: *mut size_t,
) -> *const c_void {
    guard(null(), || {
        // SAFETY: forwarded contract.
        let (cache, key) = unsafe { (cache(c)?, bytes(key, klen)?) };
        match cache.lookup(key) {
            Ok(e) => {
                let (ptr, len) = e.into_raw();
                // SAFETY: forwarded: NULL or writable.
                if let Some(out) = unsafe { vlen.as_mut() } {
                    *out = len;
                }
                Ok(ptr.cast())
            }
            Err(Miss::Absent) => Err(Error::Os(libc::ENOENT)),
            Err(Miss::Purged) => Err(Error::Os(libc::ESTALE)),
        }
    })
}

/// Releases a value from `vrange_cache_get`. Returns 0, or -1 with errno EINVAL (a pointer
/// that is not a value of this cache with a get outstanding: never another value's pin).
///
/// # Safety
/// `c` NULL or a handle from `vrange_cache_create`; `value` any pointer (it is only compared).
#[no_mangle]
pub unsafe extern "C" fn vrange_cache_release(c: *mut VrangeCache, value: *const c_void) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded contract.
        let cache = unsafe { cache(c)? };
        // Any pointer is safe here: only a value this cache gave out and not yet released as
        // often is released, and only its own pin (EINVAL otherwise).
        cache.release_raw(value.cast())?;
        Ok(0)
    })
}

/// Removes the entry under `key`. Returns 0, or -1 with errno ENOENT if there was none.
///
/// # Safety
/// `c` NULL or a handle from `vrange_cache_create` (a destroyed one is refused); `key` readable for `klen`.
#[no_mangle]
pub unsafe extern "C" fn vrange_cache_remove(
    c: *mut VrangeCache,
    key: *const c_void,
    klen: size_t,
) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded contract.
        let (cache, key) = unsafe { (cache(c)?, bytes(key, klen)?) };
        if cache.remove(key) {
            Ok(0)
        } else {
            Err(Error::Os(libc::ENOENT))
        }
    })
}

/// Fills `*out` (`size` bytes) with the cache's statistics. Returns 0 or -1 with errno.
///
/// # Safety
/// `c` NULL or a handle from `vrange_cache_create` (a destroyed one is refused); `out` NULL or writable for `size` bytes.
#[no_mangle]
pub unsafe extern "C" fn vrange_cache_stats(
    c: *mut VrangeCache,
    out: *mut VrangeCacheStats,
    size: size_t,
) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded contract.
        let cache = unsafe { cache(c)? };
        if out.is_null() || size < std::mem::size_of::<u64>() * 2 {
            return Err(Error::BadFlags);
        }
        let s = cache.stats();
        let mut full = VrangeCacheStats {
            size: 0,
            entries: s.entries,
            hits: s.hits(),
            misses: s.misses,
            purged_lookups: s.purged_lookups(),
            resident_bytes: s.resident_bytes(),
            value_bytes: s.value_bytes(),
            overhead_bytes: s.overhead_bytes(),
            purged_bytes: s.purged_bytes(),
            dropped_purged: s.dropped_purged,
            classes: std::array::from_fn(|i| (&s.classes[i]).into()),
            mapped_bytes: s.mapped_bytes(),
            pinned_bytes: s.pinned_bytes(),
            promoted: std::array::from_fn(|i| s.classes[i].promoted),
            recycled: std::array::from_fn(|i| s.classes[i].recycled),
            carried: std::array::from_fn(|i| s.classes[i].carried),
        };
        let n = size.min(std::mem::size_of::<VrangeCacheStats>());
        full.size = n as u64;
        // SAFETY: `out` is writable for `size` bytes (the contract); we write `n` <= size and
        // zero the rest.
        unsafe {
            std::ptr::copy_nonoverlapping(
                (&full as *const VrangeCacheStats).cast::<u8>(),
                out.cast::<u8>(),
                n,
            );
            std::ptr::write_bytes(out.cast::<u8>().add(n), 0, size - n);
        }
        Ok(0)
    })
}
