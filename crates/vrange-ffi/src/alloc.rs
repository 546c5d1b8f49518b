//! Library-owned regions: `vrange_alloc`, `vrange_free`, `vrange_set_priority`,
//! `vrange_shared_fd`, `vrange_map_shared`.

use crate::{flags, guard, regions};
use libc::{c_int, c_void, size_t};
use std::os::fd::BorrowedFd;
use std::ptr::null_mut;
use vrange_core::{Error, RefillRegion, ScratchRegion, VolatileRegion};

/// Allocates a region of `length` bytes (rounded up to a page), zero and pinned, following
/// `flags`; returns it or NULL with errno.
///
/// # Safety
/// None beyond the C contract: the arguments are plain values.
#[no_mangle]
pub unsafe extern "C" fn vrange_alloc(length: size_t, flags: c_int) -> *mut c_void {
    guard(null_mut(), || {
        let absurd = |e| match e {
            // An absurd length is out of memory, as for malloc(3) and mmap(2).
            Error::Overflow => Error::Os(libc::ENOMEM),
            e => e,
        };
        if flags::scratch(flags)? {
            let region = ScratchRegion::new(length).map_err(absurd)?;
            return Ok(region.into_raw().0.cast());
        }
        let opts = flags::alloc_options(flags)?;
        let region = VolatileRegion::new(length, opts).map_err(absurd)?;
        Ok(regions::hand_out(region).0.cast())
    })
}

/// The C fill function of a refill region: `fill(ctx, offset, buf, len)` writes the `len` bytes
/// of the block at `offset` into `buf` and returns 0, or anything else on failure.
pub type RefillFn = unsafe extern "C" fn(*mut c_void, size_t, *mut c_void, size_t) -> c_int;

/// The C caller's fill function and context, called on the refill thread (or, with
/// `VRANGE_FILL_HERE`, on the touching threads, several at once).
struct CFill {
    fill: RefillFn,
    ctx: *mut c_void,
}

// SAFETY: the C contract (vrange.h) says the fill function is called on a libvrange thread,
// with ctx; the caller makes ctx usable from there.
unsafe impl Send for CFill {}
// SAFETY: with VRANGE_FILL_HERE the C contract says the fill function is called from several
// threads at once, with ctx; the caller makes ctx usable so.
unsafe impl Sync for CFill {}

impl CFill {
    fn call(&self, offset: usize, buf: &mut [u8]) -> bool {
        // SAFETY: buf is a live buffer of buf.len() bytes for the call; fill and ctx are the
        // caller's, called as its contract says.
        unsafe { (self.fill)(self.ctx, offset, buf.as_mut_ptr().cast(), buf.len()) == 0 }
    }
}

/// `vrange_alloc_refill` flag: fill on the touching thread (vrange.h's `VRANGE_FILL_HERE`).
const FILL_HERE: c_int = 1 << 13;

/// Maps a refill region of `length` bytes in blocks of `block` bytes whose content `fill`
/// makes; returns it or NULL with errno. `flags` is 0 or `VRANGE_FILL_HERE`.
///
/// # Safety
/// `fill` must be a function callable with `ctx` from another thread (with `VRANGE_FILL_HERE`,
/// from a SIGBUS handler on several threads at once), as vrange.h says.
#[no_mangle]
pub unsafe extern "C" fn vrange_alloc_refill(
    length: size_t,
    flags: c_int,
    block: size_t,
    fill: Option<RefillFn>,
    ctx: *mut c_void,
) -> *mut c_void {
    guard(null_mut(), || {
        let Some(fill) = fill else {
            return Err(Error::BadFlags);
        };
        let c = CFill { fill, ctx };
        let region = match flags {
            0 => RefillRegion::new(length, block, move |offset, buf| c.call(offset, buf)),
            FILL_HERE => {
                RefillRegion::filled_here(length, block, move |offset, buf| c.call(offset, buf))
            }
            _ => return Err(Error::BadFlags),
        }
        .map_err(|e| match e {
            Error::Overflow => Error::Os(libc::ENOMEM),
            Error::Unaligned | Error::NotRegion => Error::BadFlags,
            e => e,
        })?;
        Ok(region.into_raw().0.cast())
    })
}

/// Frees the region `addr` and `length` name (as returned by `vrange_alloc` or
/// `vrange_map_shared`); returns 0 or -1 with errno EINVAL.
///
/// # Safety
/// The caller gives up the region: nothing may use it afterwards.
#[no_mangle]
pub unsafe extern "C" fn vrange_free(addr: *mut c_void, length: size_t) -> c_int {
    guard(-1, || {
        // SAFETY: forwarded contract.
        unsafe { regions::free(addr.cast(), length)? };
        Ok(0)
    })
}

/// Sets the reclaim class (0 or one `VRANGE_DROP_*` value) of `[addr, addr + length)`, which must
/// lie in one region; returns 0 or -1 with errno.
///
/// # Safety
/// None beyond the C contract: the memory is not accessed.
#[no_mangle]
pub unsafe extern "C" fn vrange_set_priority(
    addr: *mut c_void,
    length: size_t,
    priority: c_int,
) -> c_int {
    guard(-1, || {
        let priority = flags::set_priority_value(priority)?;
        vrange_core::set_priority(addr.cast(), length, priority)?;
        Ok(0)
    })
}

/// The memfd of the shared region holding `addr` (borrowed: valid until the region is freed),
/// or -1 with errno EINVAL.
///
/// # Safety
/// None beyond the C contract: the memory is not accessed.
#[no_mangle]
pub unsafe extern "C" fn vrange_shared_fd(addr: *mut c_void) -> c_int {
    guard(-1, || {
        vrange_core::shared_fd_at(addr.cast()).ok_or(Error::NotRegion)
    })
}

/// Maps the shared region behind `fd` (from `vrange_shared_fd`, in this or another process);
/// stores its length in `*length` (if not NULL) and returns it, or NULL with errno.
///
/// # Safety
/// `fd` must be an open descriptor (it is duplicated, not kept); `length` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn vrange_map_shared(
    fd: c_int,
    flags: c_int,
    length: *mut size_t,
) -> *mut c_void {
    guard(null_mut(), || {
        let opts = flags::map_shared_options(flags)?;
        if fd < 0 {
            return Err(Error::Os(libc::EBADF));
        }
        // SAFETY: fd is not -1 and the caller promises an open descriptor for the call; a stale
        // one only makes the core's fstat/dup fail with EBADF.
        let fd = unsafe { BorrowedFd::borrow_raw(fd) };
        let (ptr, len) = regions::hand_out(VolatileRegion::open_shared_with(fd, opts)?);
        if !length.is_null() {
            // SAFETY: the caller passes NULL or a writable size_t.
            unsafe { *length = len };
        }
        Ok(ptr.cast())
    })
}
