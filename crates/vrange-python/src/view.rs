//! The buffer protocol's export step, shared by the objects that hand out memoryviews: a cached
//! value (read-only), a fill function's buffer and a pinned VolatileBuffer (writable).

use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::{ffi, PyErr};
use std::ffi::{c_int, c_void};

/// Fills `view` with a one-dimensional buffer of `len` unsigned bytes at `buf`, exported by
/// `owner` (the view takes a reference to it, which CPython drops when the view is released).
/// A writable request for a read-only buffer raises `BufferError`.
///
/// # Safety
/// `view` must be the pointer CPython passed to `owner`'s `__getbuffer__`. `buf..buf + len`
/// must stay mapped and readable (and, unless `readonly`, writable) for as long as `owner` is
/// alive and the export lasts: the caller's object guarantees it (a pin it holds).
pub(crate) unsafe fn export(
    owner: &Bound<'_, PyAny>,
    view: *mut ffi::Py_buffer,
    flags: c_int,
    buf: *mut u8,
    len: usize,
    readonly: bool,
) -> PyResult<()> {
    if view.is_null() {
        return Err(PyBufferError::new_err("no view to fill"));
    }
    let Ok(len) = isize::try_from(len) else {
        // SAFETY: `view` is the non-null pointer CPython passed (caller's contract); a failed
        // export must leave `obj` NULL.
        unsafe { (*view).obj = std::ptr::null_mut() };
        return Err(PyBufferError::new_err("buffer too large"));
    };
    // SAFETY: `view` is CPython's (caller's contract), `owner` a live object; the memory stays
    // valid while the export lasts (caller's contract). PyBuffer_FillInfo sets every field,
    // takes a reference to `owner`, and on failure leaves `obj` NULL with an exception set.
    let rc = unsafe {
        ffi::PyBuffer_FillInfo(
            view,
            owner.as_ptr(),
            buf.cast::<c_void>(),
            len,
            c_int::from(readonly),
            flags,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(PyErr::fetch(owner.py()))
    }
}

/// Refuses an export with `err` (CPython requires `view->obj` to be NULL after a failure).
///
/// # Safety
/// `view` must be null or the pointer CPython passed to a `__getbuffer__`.
pub(crate) unsafe fn refuse(view: *mut ffi::Py_buffer, err: PyErr) -> PyResult<()> {
    if !view.is_null() {
        // SAFETY: a non-null `view` is CPython's, writable for the call (caller's contract).
        unsafe { (*view).obj = std::ptr::null_mut() };
    }
    Err(err)
}
