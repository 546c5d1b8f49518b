//! The Python module `vrange`: a purgeable key → bytes cache ([`vrange_cache::Cache`]), volatile
//! buffers ([`vrange::VolatileRegion`], managed policy) and an explicit purge.
//!
//! Nothing here panics across the boundary on purpose: every vrange error becomes a Python
//! exception ([`to_py_err`]), and the one deliberate unwind (abandoning an insert whose Python
//! fill function raised, `cache.rs`) is caught before it leaves this crate.
//!
//! Locks: the GIL is never awaited while a lock of this crate or of the cache is held. The
//! cache's operations take only the cache's own locks, none of which is held while Python code
//! runs, so they may run attached or detached: most run detached (`Python::detach`); the copy
//! of a small value into the cache and the lookup of a `@vrange.cached` call (`cached.rs`) run
//! attached, because letting the GIL go and taking it back would cost more than they do. An
//! attached operation that is slow (a slab made volatile since its last use is unmarked, a
//! first hit moves its value off probation, a new slab makes room first) keeps other Python
//! threads waiting meanwhile, never more. The buffer's state mutex (`buffer.rs`) is taken only
//! while attached and never held across a detach.

mod buffer;
mod cache;
mod cached;
mod view;

use pyo3::exceptions::{PyKeyError, PyMemoryError, PyOSError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyString;
use vrange::{Error, Priority};

pyo3::create_exception!(
    vrange,
    PurgedError,
    PyKeyError,
    "The value under this key was purged by the system under memory pressure. A subclass of \
     KeyError; the entry is dropped, so the next lookup of the key raises a plain KeyError."
);

/// The Python exception for a vrange error: `MemoryError` when memory could not be mapped,
/// `ValueError` for arguments vrange refuses, `OSError` (with the errno) for the rest.
pub(crate) fn to_py_err(what: &str, e: Error) -> PyErr {
    match e {
        Error::Os(libc::ENOMEM) => {
            PyMemoryError::new_err(format!("vrange: {what}: out of memory ({e})"))
        }
        Error::Unaligned
        | Error::Overflow
        | Error::BadMode
        | Error::Straddles
        | Error::Partial
        | Error::NotRegion
        | Error::BadFlags => PyValueError::new_err(format!("vrange: {what}: {e}")),
        // NotMapped, Unsupported, Refused, OutOfReach, other errnos, and any later variant.
        _ => PyOSError::new_err((e.errno(), format!("vrange: {what}: {e}"))),
    }
}

/// The priority names, lowest class (purged first) first.
pub(crate) const PRIORITY_NAMES: [(&str, Priority); 4] = [
    ("drop_first", Priority::DropFirst),
    ("low", Priority::Low),
    ("normal", Priority::Normal),
    ("drop_last", Priority::DropLast),
];

/// Parses a priority name (`ValueError` for anything else).
pub(crate) fn parse_priority(name: &str) -> PyResult<Priority> {
    PRIORITY_NAMES
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, p)| *p)
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "unknown priority {name:?}: expected one of {PRIORITY_CHOICES}"
            ))
        })
}

/// The accepted priority names, as an error message lists them.
const PRIORITY_CHOICES: &str = "\"drop_first\", \"low\", \"normal\" or \"drop_last\"";

/// A `priority` argument: one of the names of [`PRIORITY_NAMES`]. Anything but a `str`
/// (`None` included) is a `TypeError` that lists the accepted names (PyO3 prefixes it with the
/// argument's name); an unknown name is a `ValueError` from [`parse_priority`].
pub(crate) struct PriorityArg(pub(crate) Priority);

impl<'a, 'py> FromPyObject<'a, 'py> for PriorityArg {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        let obj = obj.to_owned();
        if let Ok(name) = obj.cast::<PyString>() {
            return parse_priority(name.to_str()?).map(PriorityArg);
        }
        let what = if obj.is_none() {
            "None".to_owned()
        } else {
            obj.get_type().name()?.to_string()
        };
        Err(PyTypeError::new_err(format!(
            "priority must be one of {PRIORITY_CHOICES} (a str), not {what}"
        )))
    }
}

/// The name of a priority.
pub(crate) fn priority_name(p: Priority) -> &'static str {
    PRIORITY_NAMES
        .iter()
        .find(|(_, q)| *q == p)
        .map_or("normal", |(n, _)| *n)
}

/// Purges at least `nbytes` bytes of this process's volatile memory now (whole ranges, so it
/// may free more; lowest priority class and least recently used first), as the reclaimer would
/// under memory pressure. Returns the bytes freed (0 if nothing volatile was left). Pinned
/// memory (values held through a memoryview, a pinned VolatileBuffer) is never purged.
/// `purge(1 << 60)` purges everything that can be purged.
#[pyfunction]
fn purge(py: Python<'_>, nbytes: u64) -> usize {
    let n = usize::try_from(nbytes).unwrap_or(usize::MAX);
    py.detach(|| vrange::purge(n))
}

/// Volatile memory for Python: a cache whose values the system may take back under memory
/// pressure (`Cache`), buffers that may be purged while not pinned (`VolatileBuffer`), and
/// `purge(nbytes)` to give memory back now.
/// The compiled part of the `vrange` package (`vrange/__init__.py` builds `Cache` on `_Cache`).
#[pymodule(name = "_vrange")]
fn vrange_module(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<cache::Cache>()?;
    m.add_class::<cache::Value>()?;
    m.add_class::<cache::FillBuffer>()?;
    m.add_class::<cached::Cached>()?;
    m.add_class::<buffer::VolatileBuffer>()?;
    m.add_class::<buffer::PinnedBuffer>()?;
    m.add("PurgedError", m.py().get_type::<PurgedError>())?;
    m.add_function(wrap_pyfunction!(purge, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
