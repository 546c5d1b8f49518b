//! `vrange.Cache`: [`vrange_cache::Cache`] for Python, with `bytes` and `str` keys, values
//! copied out as `bytes` by `cache[key]` or handed out by `get`, `lookup` and `get_or_insert`
//! as read-only memoryviews that keep them pinned (a pin the caller asked for by name: a held
//! view keeps the pages its value lies on from any purge, not the rest of its slab, and
//! `stats()["pinned_bytes"]` shows it).
//!
//! Keys: the cache's key is the Python key's bytes after one tag byte (`b` for `bytes`, `s`
//! for `str`, whose bytes are its UTF-8 encoding, `p` for a `tuple`, whose bytes are its
//! pickle), so `b"a"` and `"a"` are different keys, and tuples are equal keys when their
//! pickles are (`(1,)` and `(1.0,)` are different keys; cachetools' `hashkey` tuples work).
//!
//! Views: a hit is a [`Value`] (holding the value as a [`Held`]) wrapped in a `memoryview`.
//! The memoryview holds the only reference to the `Value`; releasing it (`mv.release()`,
//! leaving a `with` block, garbage collection) drops the reference, the `Value` is freed and
//! its pages released. Slices of the memoryview share its export, so they keep the value pinned too.

use crate::view;
use crate::{priority_name, to_py_err, PriorityArg, PurgedError};
use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyBufferError, PyKeyError, PyTypeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyList, PyMemoryView, PyString, PyTuple};
use std::ffi::c_int;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::Mutex;
use vrange::Priority;
use vrange_cache::{Entry, Held, Miss, Options};

type Key = Box<[u8]>;

/// Tag byte of a `bytes` key.
pub(crate) const TAG_BYTES: u8 = b'b';
/// Tag byte of a `str` key (then its UTF-8 bytes).
const TAG_STR: u8 = b's';
/// Tag byte of a `tuple` key (then its pickle).
const TAG_PICKLE: u8 = b'p';

/// `pickle.dumps` and `pickle.loads`, looked up once.
pub(crate) fn pickle<'py>(py: Python<'py>, name: &'static str) -> PyResult<Bound<'py, PyAny>> {
    static DUMPS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    static LOADS: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    let cell = if name == "dumps" { &DUMPS } else { &LOADS };
    cell.get_or_try_init(py, || Ok(py.import("pickle")?.getattr(name)?.unbind()))
        .map(|f| f.bind(py).clone())
}

/// Values at least this large are copied into the cache with the GIL released (smaller ones
/// cost less to copy than to release and take back the GIL).
const DETACH_BYTES: usize = 64 << 10;

/// The cache's key for a Python key (`TypeError` unless `bytes`, `str` or a picklable
/// `tuple`).
fn make_key(key: &Bound<'_, PyAny>) -> PyResult<Key> {
    let pickled;
    let (tag, bytes) = if let Ok(b) = key.cast::<PyBytes>() {
        (TAG_BYTES, b.as_bytes())
    } else if let Ok(s) = key.cast::<PyString>() {
        (TAG_STR, s.to_str()?.as_bytes())
    } else if key.cast::<PyTuple>().is_ok() {
        // Protocol 4: the same bytes on every Python this module supports.
        pickled = pickle(key.py(), "dumps")?
            .call1((key, 4))
            .and_then(|p| p.cast_into::<PyBytes>().map_err(PyErr::from))
            .map_err(|e| PyTypeError::new_err(format!("a tuple key must be picklable: {e}")))?;
        (TAG_PICKLE, pickled.as_bytes())
    } else {
        return Err(PyTypeError::new_err(format!(
            "cache keys are bytes, str or tuple, not {}",
            key.get_type().name()?
        )));
    };
    let mut k = Vec::with_capacity(bytes.len() + 1);
    k.push(tag);
    k.extend_from_slice(bytes);
    Ok(k.into_boxed_slice())
}

/// A cached value, pinned while this object lives. Made by the cache only; Python code sees it
/// as the `obj` of the memoryview a lookup returns.
#[pyclass(frozen, module = "vrange", name = "PinnedValue")]
pub(crate) struct Value {
    entry: Held,
}

#[pymethods]
impl Value {
    /// Exports the value read-only. No `__releasebuffer__`: the export's reference to this
    /// object is what keeps the entry pinned, and CPython drops it when the view is released.
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let entry = &slf.get().entry;
        // SAFETY: `view` is CPython's (this is its getbuffer slot). The bytes lie on pages the
        // hold keeps (never purged, never unmapped, never written again) while this object
        // lives, which the view's reference guarantees; exported read-only.
        unsafe {
            view::export(
                slf.as_any(),
                view,
                flags,
                entry.as_ptr().cast_mut(),
                entry.len(),
                true,
            )
        }
    }

    fn __len__(&self) -> usize {
        self.entry.len()
    }

    /// The value's priority class.
    #[getter]
    fn priority(&self) -> &'static str {
        priority_name(self.entry.priority())
    }

    fn __repr__(&self) -> String {
        format!(
            "<vrange.PinnedValue {} bytes, {}>",
            self.entry.len(),
            self.priority()
        )
    }
}

/// A read-only memoryview of `entry`, held (its own pages) until the view is released.
fn memoryview_of(py: Python<'_>, entry: Entry) -> PyResult<Bound<'_, PyMemoryView>> {
    let value = Bound::new(
        py,
        Value {
            entry: entry.hold(),
        },
    )?;
    PyMemoryView::from(value.as_any())
}

/// The writable buffer handed to a `get_or_insert` fill function: the value's place in its
/// slab, valid only during the call.
#[pyclass(frozen, module = "vrange", name = "FillBuffer")]
pub(crate) struct FillBuffer {
    ptr: usize,
    len: usize,
    /// Cleared when the fill function returns: no new export after that.
    valid: AtomicBool,
    /// Exports not yet released.
    exports: AtomicUsize,
    /// The pin that keeps the place mapped when the fill function kept a view of it past the
    /// call (the entry is then removed from the cache: see `Cache::get_or_insert`).
    keep: Mutex<Option<Entry>>,
}

#[pymethods]
impl FillBuffer {
    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let me = slf.get();
        if !me.valid.load(Relaxed) {
            let err = PyBufferError::new_err(
                "the buffer passed to a get_or_insert fill function is valid only during the call",
            );
            // SAFETY: `view` is CPython's (this is its getbuffer slot).
            return unsafe { view::refuse(view, err) };
        }
        // SAFETY: `view` is CPython's. While `valid`, the place is pinned by the cache's insert
        // in progress (which waits for the fill function); an export that outlives the call is
        // detected when it returns and then pinned by `keep` until this object is freed.
        unsafe { view::export(slf.as_any(), view, flags, me.ptr as *mut u8, me.len, false) }?;
        me.exports.fetch_add(1, Relaxed);
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        self.exports.fetch_sub(1, Relaxed);
    }

    fn __len__(&self) -> usize {
        self.len
    }
}

/// What a fill function left behind: its exception, and the buffer if it kept a view of it.
type FillOutcome = (Option<PyErr>, Option<Py<FillBuffer>>);

/// Calls `fill` with a writable memoryview of `buf`, then revokes the buffer.
fn run_fill(py: Python<'_>, fill: &Py<PyAny>, buf: &mut [u8]) -> FillOutcome {
    let fb = match Bound::new(
        py,
        FillBuffer {
            ptr: buf.as_mut_ptr() as usize,
            len: buf.len(),
            valid: AtomicBool::new(true),
            exports: AtomicUsize::new(0),
            keep: Mutex::new(None),
        },
    ) {
        Ok(fb) => fb,
        Err(e) => return (Some(e), None),
    };
    let mv = match PyMemoryView::from(fb.as_any()) {
        Ok(mv) => mv,
        Err(e) => return (Some(e), None),
    };
    let called = fill.call1(py, (&mv,));
    fb.get().valid.store(false, Relaxed);
    // Fails (BufferError) if something still holds an export of the memoryview itself; the
    // count below then stays above zero.
    let _ = mv.call_method0("release");
    drop(mv);
    let kept = fb.get().exports.load(Relaxed) > 0;
    (called.err(), kept.then(|| fb.unbind()))
}

/// The unwind payload that abandons an insert whose fill function raised.
struct FillRaised;

/// A raw source pointer moved into a closure that runs without the GIL.
struct Source(*const u8);

// SAFETY: the pointer is only read, by the one closure it is moved into, while the buffer
// export that keeps it valid is held by the thread that waits for that closure.
unsafe impl Send for Source {}

impl Source {
    fn ptr(&self) -> *const u8 {
        self.0
    }
}

/// A cache of byte values under `bytes` or `str` keys that the system may purge under memory
/// pressure. `cache[key] = value` copies any bytes-like value in; `cache[key]` returns a copy
/// (`bytes`, pinning nothing); `get` and `lookup` return a read-only memoryview without a copy
/// that keeps the value's own pages pinned (never purged) until it is released; the rest of
/// its slab may be purged meanwhile, and the entry with it.
/// `b"k"` and `"k"` are different keys.
///
/// `slab_bytes`: bytes per slab (default 256 KiB, at least 64 KiB): values are packed into
/// slabs and the system purges whole slabs. `budget`: resident bytes this cache keeps at most
/// (past it, an insert evicts the cache's own oldest slabs, lowest priority first, keeping
/// the values read since they were written by copying them on); None for no budget of its own (the process's reclaimer still purges under memory
/// pressure). `probation` (default True): a key's first value is purged before values that
/// were read, until its first hit moves it (scan resistance; False: no probation).
/// The Python key a cache key was made from ([`make_key`] undone).
fn python_key<'py>(py: Python<'py>, key: &[u8]) -> PyResult<Bound<'py, PyAny>> {
    match key.split_first() {
        Some((&TAG_BYTES, b)) => Ok(PyBytes::new(py, b).into_any()),
        Some((&TAG_STR, b)) => match std::str::from_utf8(b) {
            Ok(text) => Ok(PyString::new(py, text).into_any()),
            Err(e) => Err(PyTypeError::new_err(format!(
                "a str key that is not UTF-8: {e}"
            ))),
        },
        Some((&TAG_PICKLE, b)) => pickle(py, "loads")?.call1((PyBytes::new(py, b),)),
        _ => Err(PyTypeError::new_err("a cache key of unknown type")),
    }
}

#[pyclass(frozen, subclass, module = "vrange", name = "_Cache")]
pub(crate) struct Cache {
    pub(crate) inner: vrange_cache::Cache<Key>,
}

impl Cache {
    /// Copies `value` (any C-contiguous buffer) in under `key`.
    pub(crate) fn insert(
        &self,
        py: Python<'_>,
        key: Key,
        value: &Bound<'_, PyAny>,
        priority: Priority,
    ) -> PyResult<()> {
        let buf = PyUntypedBuffer::get(value)?;
        if !buf.is_c_contiguous() {
            return Err(PyBufferError::new_err(
                "cache values must be C-contiguous buffers (copy it with bytes(value) first)",
            ));
        }
        let len = buf.len_bytes();
        let src = Source(buf.buf_ptr() as *const u8);
        let copy = move |dst: &mut [u8]| {
            // SAFETY: `src` points to `len` readable bytes, kept alive and unmoved by the
            // export `buf` holds until after this insert returns; `dst` is `len` bytes of a
            // fresh place in a slab, which cannot overlap a Python object's buffer. A Python
            // thread writing the source meanwhile (possible only for large values, copied
            // with the GIL released) can tear the copy, as with os.write.
            unsafe { std::ptr::copy_nonoverlapping(src.ptr(), dst.as_mut_ptr(), dst.len()) }
        };
        let inserted = if len >= DETACH_BYTES {
            py.detach(|| self.inner.insert_with(key, len, priority, copy))
        } else {
            self.inner.insert_with(key, len, priority, copy)
        };
        buf.release(py);
        inserted.map_err(|e| to_py_err("cannot store the value", e))
    }

    fn lookup_key(&self, py: Python<'_>, key: &Key) -> Result<Entry, Miss> {
        py.detach(|| self.inner.lookup(&key[..]))
    }
}

#[pymethods]
impl Cache {
    #[new]
    #[pyo3(signature = (slab_bytes=None, budget=None, probation=true))]
    fn new(slab_bytes: Option<usize>, budget: Option<usize>, probation: bool) -> PyResult<Cache> {
        let defaults = Options::default();
        let slab_bytes = slab_bytes.unwrap_or(defaults.slab_bytes);
        let inner = vrange_cache::Cache::try_new(Options {
            slab_bytes,
            budget,
            probation,
            ..defaults
        })
        .map_err(|e| {
            to_py_err(
                &format!(
                    "slab_bytes={slab_bytes} is more than {}",
                    vrange_cache::MAX_SLAB_BYTES
                ),
                e,
            )
        })?;
        Ok(Cache { inner })
    }

    /// Bytes per slab in force (rounded up to a page, at least 64 KiB).
    #[getter]
    fn slab_bytes(&self) -> usize {
        self.inner.options().slab_bytes
    }

    /// The cache's own resident budget in bytes, or None.
    #[getter]
    fn budget(&self) -> Option<usize> {
        self.inner.options().budget
    }

    /// Copies `value` (any bytes-like object) in under `key`, replacing any value, in class
    /// `priority`: "drop_first", "low", "normal" or "drop_last" (purged in that order).
    #[pyo3(signature = (key, value, priority=PriorityArg(Priority::Normal)))]
    fn put(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        priority: PriorityArg,
    ) -> PyResult<()> {
        self.insert(py, make_key(key)?, value, priority.0)
    }

    fn __setitem__(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        self.insert(py, make_key(key)?, value, Priority::Normal)
    }

    /// The value under `key` as a read-only memoryview that keeps it pinned until released,
    /// or `default` if there is none or it was purged (a purged entry is then dropped; use
    /// `lookup` to tell the two apart).
    #[pyo3(signature = (key, default=None))]
    fn get<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        default: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let k = make_key(key)?;
        match self.lookup_key(py, &k) {
            Ok(e) => Ok(memoryview_of(py, e)?.into_any()),
            Err(_) => Ok(default.unwrap_or_else(|| py.None().into_bound(py))),
        }
    }

    /// A copy of the value under `key`, as `bytes`: it pins nothing, so keeping it costs its
    /// own size and holds nothing (use `get` or `lookup` for a pinned view without a copy). Raises KeyError if there is none, and PurgedError (a KeyError) if the system
    /// purged it: the entry is then dropped, so the next lookup raises a plain KeyError.
    fn __getitem__<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let k = make_key(key)?;
        match self.lookup_key(py, &k) {
            // The pin lasts only for the copy.
            Ok(e) => Ok(PyBytes::new(py, &e)),
            Err(Miss::Absent) => Err(PyKeyError::new_err(key.clone().unbind())),
            Err(Miss::Purged) => Err(PurgedError::new_err(key.clone().unbind())),
        }
    }

    /// `(memoryview, "hit")`, `(None, "absent")` or `(None, "purged")` (reported once: the
    /// purged entry is dropped).
    fn lookup<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
    ) -> PyResult<(Option<Bound<'py, PyMemoryView>>, &'static str)> {
        let k = make_key(key)?;
        Ok(match self.lookup_key(py, &k) {
            Ok(e) => (Some(memoryview_of(py, e)?), "hit"),
            Err(Miss::Absent) => (None, "absent"),
            Err(Miss::Purged) => (None, "purged"),
        })
    }

    /// Removes the entry (a purged one too); KeyError if there is none. Memoryviews of its
    /// value stay valid until released.
    fn __delitem__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<()> {
        let k = make_key(key)?;
        if py.detach(|| self.inner.remove(&k[..])) {
            Ok(())
        } else {
            Err(PyKeyError::new_err(key.clone().unbind()))
        }
    }

    /// Whether an entry under `key` is held and not known to be purged. Pins nothing and
    /// counts no lookup.
    fn __contains__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let k = make_key(key)?;
        Ok(py.detach(|| self.inner.contains_key(&k[..])))
    }

    /// Entries held (purged ones the cache has noticed are not counted).
    fn __len__(&self, py: Python<'_>) -> usize {
        py.detach(|| self.inner.len())
    }

    /// The keys held now and not known to be purged, as a list (a snapshot: see
    /// `vrange_cache::Cache::keys`). The package's `Cache` iterates over it.
    fn _keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let keys = py.detach(|| self.inner.keys());
        let list = PyList::empty(py);
        for k in &keys {
            list.append(python_key(py, k)?)?;
        }
        Ok(list)
    }

    /// Removes every entry; memory returns as memoryviews of the values are released.
    fn clear(&self, py: Python<'_>) {
        py.detach(|| self.inner.clear());
    }

    /// The value under `key`, or, if there is none or it was purged, the one `fill(buf)` writes
    /// in place: `buf` is a writable memoryview of `size` bytes (zero or stale: write them
    /// all), valid only during the call. Returns a pinned read-only memoryview. If `fill`
    /// raises, nothing is inserted and the exception propagates. A view of `buf` kept past the
    /// call raises BufferError (the kept view stays valid; the entry is removed).
    #[pyo3(signature = (key, size, fill, priority=PriorityArg(Priority::Normal)))]
    fn get_or_insert<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        size: usize,
        fill: Py<PyAny>,
        priority: PriorityArg,
    ) -> PyResult<Bound<'py, PyMemoryView>> {
        let priority = priority.0;
        let k = make_key(key)?;
        let mut outcome: Option<FillOutcome> = None;
        let mut raised: Option<PyErr> = None;
        let done = py.detach(|| {
            std::panic::catch_unwind(AssertUnwindSafe(|| {
                self.inner.get_or_insert_with(k, size, priority, |buf| {
                    let (err, kept) = Python::attach(|py| run_fill(py, &fill, buf));
                    match (err, kept) {
                        (Some(err), None) => {
                            // Abandon the insert: the cache gives the place up as it unwinds
                            // (as for a panicking fill). resume_unwind runs no panic hook.
                            raised = Some(err);
                            std::panic::resume_unwind(Box::new(FillRaised));
                        }
                        (err, kept) => outcome = Some((err, kept)),
                    }
                })
            }))
        });
        let entry = match done {
            Ok(Ok(entry)) => entry,
            Ok(Err(e)) => return Err(to_py_err("cannot store the value", e)),
            Err(payload) if payload.is::<FillRaised>() => {
                return Err(
                    raised.unwrap_or_else(|| PyBufferError::new_err("the fill function failed"))
                );
            }
            // A bug: let PyO3 turn it into a PanicException at the boundary.
            Err(payload) => std::panic::resume_unwind(payload),
        };
        match outcome {
            // A hit (fill not called) or a clean fill.
            None | Some((None, None)) => memoryview_of(py, entry),
            Some((err, Some(fb))) => {
                // A view of the place outlives the call: keep the place pinned (so mapped)
                // for as long as that view, and take the value out of the cache, whose values
                // must not change. (A concurrent insert of the same key in between would be
                // removed too; this is the error path of a misused API.)
                *fb.get().keep.lock().unwrap_or_else(|p| p.into_inner()) = Some(entry);
                let k = make_key(key)?;
                py.detach(|| self.inner.remove(&k[..]));
                Err(err.unwrap_or_else(|| {
                    PyBufferError::new_err(
                        "the fill function kept a view of its buffer after returning: the \
                         buffer is valid only during the call (the value was not cached)",
                    )
                }))
            }
            Some((Some(err), None)) => Err(err), // unreachable: unwound above
        }
    }

    /// Statistics: hits, misses, purged_lookups, entries, resident_bytes (the most the cache
    /// can hold in memory: written pages of slabs not known to be purged), mapped_bytes (the
    /// slabs' address space), pinned_bytes (bytes held views keep from any purge now),
    /// value_bytes, purged_bytes, overhead_bytes, dropped_purged, and "classes": per priority
    /// name, hits, inserts, purged_lookups, promoted (values moved off probation by their
    /// first hit), recycled (slabs whose pages a new slab took over while memory was short),
    /// purged_entries, purged_bytes, resident_bytes, mapped_bytes, pinned_bytes,
    /// value_bytes and slabs.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = py.detach(|| self.inner.stats());
        let d = PyDict::new(py);
        d.set_item("hits", s.hits())?;
        d.set_item("misses", s.misses)?;
        d.set_item("purged_lookups", s.purged_lookups())?;
        d.set_item("entries", s.entries)?;
        d.set_item("resident_bytes", s.resident_bytes())?;
        d.set_item("mapped_bytes", s.mapped_bytes())?;
        d.set_item("pinned_bytes", s.pinned_bytes())?;
        d.set_item("value_bytes", s.value_bytes())?;
        d.set_item("purged_bytes", s.purged_bytes())?;
        d.set_item("overhead_bytes", s.overhead_bytes())?;
        d.set_item("dropped_purged", s.dropped_purged)?;
        let classes = PyDict::new(py);
        for c in &s.classes {
            let cd = PyDict::new(py);
            cd.set_item("hits", c.hits)?;
            cd.set_item("inserts", c.inserts)?;
            cd.set_item("purged_lookups", c.purged_lookups)?;
            cd.set_item("promoted", c.promoted)?;
            cd.set_item("recycled", c.recycled)?;
            cd.set_item("carried", c.carried)?;
            cd.set_item("purged_entries", c.purged_entries)?;
            cd.set_item("purged_bytes", c.purged_bytes)?;
            cd.set_item("resident_bytes", c.resident_bytes)?;
            cd.set_item("mapped_bytes", c.mapped_bytes)?;
            cd.set_item("pinned_bytes", c.pinned_bytes)?;
            cd.set_item("value_bytes", c.value_bytes)?;
            cd.set_item("slabs", c.slabs)?;
            classes.set_item(priority_name(c.priority), cd)?;
        }
        d.set_item("classes", classes)?;
        Ok(d)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let n = self.__len__(py);
        let o = self.inner.options();
        let budget = o
            .budget
            .map_or_else(|| "None".to_owned(), |b| b.to_string());
        format!(
            "<vrange.Cache {n} entries, slab_bytes={}, budget={budget}>",
            o.slab_bytes
        )
    }
}
