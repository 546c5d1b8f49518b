//! `vrange.VolatileBuffer`: a managed [`VolatileRegion`], volatile except while pinned.
//!
//! A new region is zero and pinned; the constructor marks it volatile at once, so the buffer
//! is purgeable from the start and the first `pin()` finds it intact (zero) unless the system
//! purged it meanwhile (then it reads zero too, and `purged` says so).
//!
//! `buf.pin()` pins the region at once and returns a [`PinnedBuffer`], a context manager with
//! the buffer protocol. Ending the pin (leaving the `with` block, `unpin()`, or the pin object
//! being freed) makes the region volatile again as soon as no memoryview of it is left: a
//! memoryview still alive then keeps the region pinned until it is released. A memoryview
//! cannot be made from an ended pin.
//!
//! State (one mutex per buffer, taken only with the GIL held and never across a detach):
//! `active` is the generation of the pin in force, `exports` counts the live memoryviews of any
//! pin, `pinned` says whether the region is unmarked. The region is marked exactly when no pin
//! is active and no export is left.

use crate::{to_py_err, view};
use pyo3::exceptions::{PyBufferError, PyRuntimeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use std::ffi::c_int;
use std::sync::{Mutex, MutexGuard};
use vrange::{Options, Policy, VolatileRegion};

struct State {
    /// The generation of the pin in force, if any.
    active: Option<u64>,
    /// The last generation handed out.
    generation: u64,
    /// Memoryviews of the region not yet released (of the active pin or of ended ones).
    exports: usize,
    /// The region is unmarked (not volatile).
    pinned: bool,
}

/// A buffer whose content the system may purge (it then reads as zero) while it is not
/// pinned. `VolatileBuffer(size)` makes one of `size` bytes (at least 1), volatile and zero;
/// `buf.pin()` pins it for a `with` block and says whether its content was purged.
#[pyclass(frozen, module = "vrange")]
pub(crate) struct VolatileBuffer {
    region: VolatileRegion,
    size: usize,
    state: Mutex<State>,
}

impl VolatileBuffer {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks the region volatile if no pin is active and no memoryview of it is left.
    fn settle(&self, st: &mut State) {
        if st.active.is_none() && st.exports == 0 && st.pinned {
            // SAFETY: no pin is active and no memoryview of the region is left (both counted
            // under this lock, which every export takes), and this crate keeps no reference into
            // the region outside a pin: nothing assumes its content stable while volatile.
            if unsafe { self.region.mark() }.is_ok() {
                st.pinned = false;
            }
            // On failure the region stays pinned, which loses nothing; the next pin finds it
            // pinned and intact.
        }
    }
}

#[pymethods]
impl VolatileBuffer {
    #[new]
    fn new(size: usize) -> PyResult<VolatileBuffer> {
        if size == 0 {
            return Err(PyValueError::new_err(
                "VolatileBuffer size must be at least 1",
            ));
        }
        let opts = Options {
            policy: Policy::Managed,
            ..Options::default()
        };
        let region = VolatileRegion::new(size, opts)
            .map_err(|e| to_py_err(&format!("cannot map a buffer of {size} bytes"), e))?;
        // SAFETY: the region was just created: no reference into it exists.
        unsafe { region.mark() }.map_err(|e| to_py_err("cannot make the buffer volatile", e))?;
        Ok(VolatileBuffer {
            region,
            size,
            state: Mutex::new(State {
                active: None,
                generation: 0,
                exports: 0,
                pinned: false,
            }),
        })
    }

    /// Pins the buffer (it cannot be purged until the pin ends) and returns the pin: a context
    /// manager whose `purged` says whether the content was purged while volatile (it then
    /// reads as zero), and whose `memoryview(pin)` is the writable content. RuntimeError if
    /// the buffer is already pinned.
    fn pin(slf: &Bound<'_, Self>) -> PyResult<PinnedBuffer> {
        let me = slf.get();
        let mut st = me.lock();
        if st.active.is_some() {
            return Err(PyRuntimeError::new_err(
                "VolatileBuffer is already pinned: leave the other `with buf.pin()` block \
                 (or call its unpin()) first",
            ));
        }
        let purged = if st.pinned {
            // Kept pinned by a memoryview of an ended pin: nothing can have been purged.
            false
        } else {
            let report = me
                .region
                .unmark()
                .map_err(|e| to_py_err("cannot pin the buffer", e))?;
            st.pinned = true;
            report.was_purged()
        };
        st.generation += 1;
        st.active = Some(st.generation);
        Ok(PinnedBuffer {
            buffer: slf.clone().unbind(),
            generation: st.generation,
            purged,
        })
    }

    /// Whether the buffer is pinned (cannot be purged): a pin is in force, or a memoryview of
    /// an ended pin is still alive and keeps it pinned.
    #[getter]
    fn pinned(&self) -> bool {
        self.lock().pinned
    }

    fn __len__(&self) -> usize {
        self.size
    }

    fn __repr__(&self) -> String {
        let state = if self.pinned() { "pinned" } else { "volatile" };
        format!("<vrange.VolatileBuffer {} bytes, {state}>", self.size)
    }
}

/// A pin of a VolatileBuffer (from `buf.pin()`): use it in a `with` block. `purged` tells
/// whether the content was purged while volatile; `memoryview(pin)` is the writable content,
/// valid while the pin lasts (a memoryview alive when the pin ends keeps the buffer pinned
/// until it is released).
#[pyclass(frozen, module = "vrange")]
pub(crate) struct PinnedBuffer {
    buffer: Py<VolatileBuffer>,
    generation: u64,
    purged: bool,
}

/// A pin no one references any more ends (a memoryview of it references it, so this comes
/// after the last one is released).
impl Drop for PinnedBuffer {
    fn drop(&mut self) {
        self.end();
    }
}

impl PinnedBuffer {
    fn end(&self) {
        let buf = self.buffer.get();
        let mut st = buf.lock();
        if st.active == Some(self.generation) {
            st.active = None;
            buf.settle(&mut st);
        }
    }
}

#[pymethods]
impl PinnedBuffer {
    /// Whether the content was purged while the buffer was volatile (it reads as zero).
    #[getter]
    fn purged(&self) -> bool {
        self.purged
    }

    /// Whether this pin is still in force.
    #[getter]
    fn active(&self) -> bool {
        self.buffer.get().lock().active == Some(self.generation)
    }

    /// Ends the pin (the buffer becomes volatile once no memoryview of it is left). Does
    /// nothing if it has ended already.
    fn unpin(&self) {
        self.end();
    }

    fn __enter__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: &Bound<'_, PyTuple>) -> bool {
        self.end();
        false
    }

    fn __len__(&self) -> usize {
        self.buffer.get().size
    }

    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let me = slf.get();
        let buf = me.buffer.get();
        let mut st = buf.lock();
        if st.active != Some(me.generation) {
            let err = PyBufferError::new_err("this pin has ended: pin the buffer again");
            // SAFETY: `view` is CPython's (this is its getbuffer slot).
            return unsafe { view::refuse(view, err) };
        }
        // SAFETY: `view` is CPython's. The region is pinned (this pin is active) and stays
        // pinned while the export is counted (`settle` marks it only at zero exports); it stays
        // mapped while the view's reference keeps this object, and so the buffer, alive.
        unsafe {
            view::export(
                slf.as_any(),
                view,
                flags,
                buf.region.as_ptr(),
                buf.size,
                false,
            )
        }?;
        st.exports += 1;
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        let buf = self.buffer.get();
        let mut st = buf.lock();
        st.exports = st.exports.saturating_sub(1);
        buf.settle(&mut st);
    }

    fn __repr__(&self) -> String {
        format!(
            "<vrange.PinnedBuffer {} bytes, purged={}, {}>",
            self.buffer.get().size,
            if self.purged { "True" } else { "False" },
            if self.active() { "active" } else { "ended" }
        )
    }
}
