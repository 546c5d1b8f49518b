//! The call path of `@vrange.cached`: the wrapper a decorated function becomes, its table of
//! calls (argument key → where the result is kept) and its counters. The package's
//! `_CachedFunction` (`python/vrange/__init__.py`) subclasses it for what a call never needs
//! (`cache_info()`'s named tuple, binding as a method, pickling by name).
//!
//! Compiled because a hit is what the decorator is for, and in Python each of its steps (the
//! wrapper's frame, packing `*args`, the key, two dict lookups, the counters) cost about as
//! much as `functools.lru_cache`'s whole hit. A hit here is what `lru_cache`'s is (the key
//! built as its C code builds it, one `dict` lookup, a counter) plus one lookup in the cache,
//! whose pin lasts only for the copy into a `bytes` (the last hit's again when nothing holds
//! it any more: [`Spare`]).
//!
//! Must never hold a lock across Python code (the function, `__hash__` and `__eq__` of the
//! arguments): the table is a `dict`, whose operations the GIL makes atomic, as for
//! `lru_cache`'s, and the counters are atomics. The cache lookup of a hit runs attached to the
//! interpreter (see the crate's notes on locks); everything else the cache does here runs
//! detached.

use crate::cache::{pickle, Cache};
use crate::{priority_name, PriorityArg};
use pyo3::exceptions::{PyException, PyTypeError};
use pyo3::ffi;
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyInt, PyString, PyTuple};
use pyo3::{intern, PyTraverseError};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize};
use vrange::Priority;
use vrange_cache::Miss;

/// Tells the decorated functions' entries apart in a shared cache.
static FUNCTION_IDS: AtomicU64 = AtomicU64::new(0);

/// The table is pruned of entries whose results are gone when it reaches this many entries,
/// then each time it has doubled since.
const FIRST_PRUNE: usize = 1024;

/// Marks where keyword arguments begin in a call's key (as `functools`' `kwd_mark`): one
/// object no argument can equal but itself.
fn kwargs_mark(py: Python<'_>) -> PyResult<&Bound<'_, PyAny>> {
    static MARK: PyOnceLock<Py<PyAny>> = PyOnceLock::new();
    MARK.get_or_try_init(py, || Ok(py.get_type::<PyAny>().call0()?.unbind()))
        .map(|m| m.bind(py))
}

/// The largest result a wrapper keeps a spare `bytes` for: a page. It is what a wrapper holds
/// outside volatile memory at most; past it, allocating the `bytes` costs little beside the copy.
#[cfg_attr(Py_GIL_DISABLED, allow(dead_code))]
const SPARE_MAX: usize = 4096;

/// The `bytes` object of the last hit, overwritten by the next hit of the same length if
/// nothing else holds it by then (a caller that dropped its result, as most do before calling
/// again). A `bytes` of 1 KiB is past the sizes glibc's malloc keeps in its per-thread cache: a
/// fresh one per hit costs as much as all the rest of the hit beyond `lru_cache`'s.
///
/// Written by hand because the reuse rests on the reference count, which is exact only with the
/// GIL held; the interpreter does the same (`zip` and `enumerate` hand out their result tuple
/// again when they hold its only reference). A free-threaded build makes a new `bytes` for
/// every hit.
struct Spare(AtomicPtr<ffi::PyObject>);

impl Spare {
    fn new() -> Spare {
        Spare(AtomicPtr::new(std::ptr::null_mut()))
    }

    /// A `bytes` equal to `value` that nothing else holds.
    #[cfg(not(Py_GIL_DISABLED))]
    fn bytes<'py>(&self, py: Python<'py>, value: &[u8]) -> Bound<'py, PyBytes> {
        // Lengths 0 and 1 are the interpreter's shared objects.
        if !(2..=SPARE_MAX).contains(&value.len()) {
            return PyBytes::new(py, value);
        }
        let taken = self.0.swap(std::ptr::null_mut(), Relaxed);
        let mut reused = None;
        if !taken.is_null() {
            // SAFETY: `taken` is the reference the spare owned (an exact `bytes`, made below),
            // now ours.
            let spare =
                unsafe { Bound::from_owned_ptr(py, taken).cast_into_unchecked::<PyBytes>() };
            // SAFETY: `taken` is alive (we hold a reference).
            if unsafe { ffi::Py_REFCNT(taken) } == 1 && spare.as_bytes().len() == value.len() {
                // SAFETY: with the GIL held, a count of one is our reference alone: no other
                // code can reach the object, so writing its bytes is writing into a `bytes`
                // just made, as the interpreter itself does before handing one out. Its
                // cached hash (of the old bytes) is reset; the length is the same.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        value.as_ptr(),
                        ffi::PyBytes_AS_STRING(taken).cast::<u8>().cast_mut(),
                        value.len(),
                    );
                    #[allow(deprecated)] // deprecated for readers; bytes_hash still caches in it
                    {
                        (*taken.cast::<ffi::PyBytesObject>()).ob_shash = -1;
                    }
                }
                reused = Some(spare);
            }
        }
        let out = reused.unwrap_or_else(|| PyBytes::new(py, value));
        let old = self.0.swap(out.clone().into_ptr(), Relaxed);
        if !old.is_null() {
            // SAFETY: a reference the spare owned. (None: the GIL is held from the first swap
            // to this one. Swapping keeps the ownership plain without relying on that.)
            drop(unsafe { Bound::from_owned_ptr(py, old) });
        }
        out
    }

    #[cfg(Py_GIL_DISABLED)]
    fn bytes<'py>(&self, py: Python<'py>, value: &[u8]) -> Bound<'py, PyBytes> {
        PyBytes::new(py, value)
    }
}

impl Drop for Spare {
    fn drop(&mut self) {
        let p = *self.0.get_mut();
        if !p.is_null() {
            // SAFETY: the reference the spare owned.
            Python::attach(|py| drop(unsafe { Bound::from_owned_ptr(py, p) }));
        }
    }
}

/// Where a call's result is kept: the cache key (as `Cache` stores a `bytes` key) and whether
/// the value is the result itself (`bytes`) or its pickle. A result whose kind changes gets a
/// new key, so a reader holding the old slot never reads one kind as the other.
#[pyclass(frozen, module = "vrange", name = "_CachedSlot")]
pub(crate) struct Slot {
    key: Box<[u8]>,
    is_bytes: bool,
}

/// What `cached` makes of a function: calling it returns the function's result for those
/// arguments, from the cache when it holds it.
#[pyclass(frozen, subclass, module = "vrange", name = "_Cached")]
pub(crate) struct Cached {
    func: Py<PyAny>,
    store: Py<Cache>,
    typed: bool,
    priority: Priority,
    /// This function's prefix of its cache keys (`Cache`'s tag for a `bytes` key, then
    /// `vrange.cached:N:`); an entry's key adds a serial number.
    prefix: Vec<u8>,
    serial: AtomicU64,
    /// Call key → [`Slot`].
    entries: Py<PyDict>,
    prune_at: AtomicUsize,
    hits: AtomicU64,
    misses: AtomicU64,
    purged: AtomicU64,
    spare: Spare,
}

impl Cached {
    /// The call's key, as `functools.lru_cache` makes it (in C): a lone `int` or `str`
    /// argument is its own key unless `typed`; otherwise the positional arguments, then a
    /// mark and each keyword's name and value, then (if `typed`) the arguments' types.
    fn key<'py>(
        &self,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let kwargs = kwargs.filter(|k| !k.is_empty());
        if !self.typed && kwargs.is_none() {
            if args.len() == 1 {
                let only = args.get_item(0)?;
                if only.is_exact_instance_of::<PyInt>() || only.is_exact_instance_of::<PyString>() {
                    return Ok(only);
                }
            }
            return Ok(args.clone().into_any());
        }
        let py = args.py();
        let mut key: Vec<Bound<'py, PyAny>> = args.iter().collect();
        if let Some(kw) = kwargs {
            key.push(kwargs_mark(py)?.clone());
            for (k, v) in kw.iter() {
                key.push(k);
                key.push(v);
            }
        }
        if self.typed {
            key.extend(args.iter().map(|a| a.get_type().into_any()));
            if let Some(kw) = kwargs {
                key.extend(kw.values().iter().map(|v| v.get_type().into_any()));
            }
        }
        Ok(PyTuple::new(py, key)?.into_any())
    }

    /// The slot for `key`'s result, of kind `is_bytes`: the one in the table, or a new one.
    fn remember(&self, key: &Bound<'_, PyAny>, is_bytes: bool) -> PyResult<Py<Slot>> {
        let py = key.py();
        let entries = self.entries.bind(py);
        let held = entries.get_item(key)?;
        if let Some(slot) = held.as_ref().and_then(|s| s.cast::<Slot>().ok()) {
            if slot.get().is_bytes == is_bytes {
                return Ok(slot.clone().unbind());
            }
        }
        // Before the new slot goes in: its result is not in the cache yet.
        if entries.len() >= self.prune_at.load(Relaxed) {
            self.prune(entries)?;
        }
        let mut k = self.prefix.clone();
        k.extend_from_slice(&self.serial.fetch_add(1, Relaxed).to_le_bytes());
        let fresh = Bound::new(
            py,
            Slot {
                key: k.into_boxed_slice(),
                is_bytes,
            },
        )?;
        let slot = if held.is_none() {
            // Another thread may have stored a slot for this key meanwhile: its slot wins.
            entries
                .call_method1(intern!(py, "setdefault"), (key, &fresh))?
                .cast_into::<Slot>()?
        } else {
            entries.set_item(key, &fresh)?;
            fresh
        };
        Ok(slot.unbind())
    }

    /// Forgets the entries whose results are gone (amortised: the table has doubled since the
    /// last time).
    fn prune(&self, entries: &Bound<'_, PyDict>) -> PyResult<()> {
        let mut keys = Vec::with_capacity(entries.len());
        let mut slots = Vec::with_capacity(entries.len());
        // A snapshot (`dict.items()`): other threads may change the table meanwhile.
        for item in entries.items().iter() {
            let (k, slot) = item.extract::<(Bound<'_, PyAny>, Bound<'_, PyAny>)>()?;
            if let Ok(s) = slot.cast_into::<Slot>() {
                keys.push(k);
                slots.push(s.unbind());
            }
        }
        let held = self.held(entries.py(), &slots);
        for ((k, slot), held) in keys.iter().zip(&slots).zip(held) {
            // Unless another thread replaced it meanwhile.
            if !held && entries.get_item(k)?.is_some_and(|now| now.is(slot)) {
                entries.del_item(k)?;
            }
        }
        self.prune_at
            .store(FIRST_PRUNE.max(2 * entries.len()), Relaxed);
        Ok(())
    }

    /// The table's slots now.
    fn slots(&self, py: Python<'_>) -> Vec<Py<Slot>> {
        self.entries
            .bind(py)
            .values()
            .iter()
            .filter_map(|s| s.cast_into::<Slot>().ok().map(Bound::unbind))
            .collect()
    }

    /// Whether the cache holds each slot's result and does not know it purged.
    fn held(&self, py: Python<'_>, slots: &[Py<Slot>]) -> Vec<bool> {
        let store = self.store.get();
        py.detach(|| {
            slots
                .iter()
                .map(|s| store.inner.contains_key(&s.get().key[..]))
                .collect()
        })
    }

    /// Calls the function and keeps its result (`bytes` as it is, anything else pickled).
    fn miss<'py>(
        &self,
        key: &Bound<'py, PyAny>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = key.py();
        self.misses.fetch_add(1, Relaxed);
        let result = self.func.bind(py).call(args, kwargs)?;
        let (data, is_bytes) = if result.is_exact_instance_of::<PyBytes>() {
            (result.clone(), true)
        } else {
            // Protocol -1: the highest this Python has.
            match pickle(py, "dumps")?.call1((&result, -1)) {
                Ok(p) => (p, false),
                Err(e) if e.is_instance_of::<PyException>(py) => {
                    let name = self
                        .func
                        .bind(py)
                        .getattr(intern!(py, "__qualname__"))
                        .map_or_else(|_| "the function".to_owned(), |n| n.to_string());
                    let err = PyTypeError::new_err(format!(
                        "vrange.cached: {name} returned a {}, which is neither bytes nor \
                         picklable: {e}",
                        result.get_type().name()?
                    ));
                    err.set_cause(py, Some(e));
                    return Err(err);
                }
                Err(e) => return Err(e),
            }
        };
        let slot = self.remember(key, is_bytes)?;
        let k = slot.get().key.clone();
        self.store.get().insert(py, k, &data, self.priority)?;
        Ok(result)
    }
}

#[pymethods]
impl Cached {
    #[new]
    #[pyo3(signature = (func, cache, typed, priority))]
    fn new(
        py: Python<'_>,
        func: Py<PyAny>,
        cache: Py<Cache>,
        typed: bool,
        priority: PriorityArg,
    ) -> Cached {
        let id = FUNCTION_IDS.fetch_add(1, Relaxed);
        let mut prefix = vec![crate::cache::TAG_BYTES];
        prefix.extend_from_slice(format!("vrange.cached:{id}:").as_bytes());
        Cached {
            func,
            store: cache,
            typed,
            priority: priority.0,
            prefix,
            serial: AtomicU64::new(0),
            entries: PyDict::new(py).unbind(),
            prune_at: AtomicUsize::new(FIRST_PRUNE),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            purged: AtomicU64::new(0),
            spare: Spare::new(),
        }
    }

    /// The function's result for these arguments: from the cache (a copy, `bytes`, or a new
    /// object unpickled) when it holds it, otherwise computed and kept.
    #[pyo3(signature = (*args, **kwargs))]
    fn __call__<'py>(
        &self,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = args.py();
        let key = self.key(args, kwargs)?;
        if let Some(slot) = self.entries.bind(py).get_item(&key)? {
            if let Ok(slot) = slot.cast::<Slot>() {
                let slot = slot.get();
                match self.store.get().inner.lookup(&slot.key[..]) {
                    Ok(entry) => {
                        // The pin lasts only for the copy.
                        let data = self.spare.bytes(py, &entry);
                        drop(entry);
                        self.hits.fetch_add(1, Relaxed);
                        return if slot.is_bytes {
                            Ok(data.into_any())
                        } else {
                            pickle(py, "loads")?.call1((data,))
                        };
                    }
                    Err(Miss::Purged) => {
                        self.purged.fetch_add(1, Relaxed);
                    }
                    Err(Miss::Absent) => {}
                }
            }
        }
        self.miss(&key, args, kwargs)
    }

    /// `(hits, misses, currsize, purged)`: what `cache_info()` reports.
    fn _info(&self, py: Python<'_>) -> (u64, u64, usize, u64) {
        let held = self.held(py, &self.slots(py));
        (
            self.hits.load(Relaxed),
            self.misses.load(Relaxed),
            held.into_iter().filter(|&h| h).count(),
            self.purged.load(Relaxed),
        )
    }

    /// Forgets every result of this function (removing them from the cache) and resets the
    /// counts.
    fn cache_clear(&self, py: Python<'_>) {
        let gone = self.slots(py);
        self.entries.bind(py).clear();
        self.hits.store(0, Relaxed);
        self.misses.store(0, Relaxed);
        self.purged.store(0, Relaxed);
        let store = self.store.get();
        py.detach(|| {
            for s in &gone {
                store.inner.remove(&s.get().key[..]);
            }
        });
    }

    /// `{"maxsize": None, "typed": ..., "priority": ...}`.
    fn cache_parameters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("maxsize", py.None())?;
        d.set_item("typed", self.typed)?;
        d.set_item("priority", priority_name(self.priority))?;
        Ok(d)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.func)?;
        visit.call(&self.store)?;
        visit.call(&self.entries)
    }
}
