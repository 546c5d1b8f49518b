"""Volatile memory for Python: a cache whose values the system may take back under memory
pressure (`Cache`, a mutable mapping), a decorator that keeps a function's results there
(`cached`), buffers that may be purged while not pinned (`VolatileBuffer`), and
`purge(nbytes)` to give memory back now.

The compiled part is `vrange._vrange`; this module builds the mapping and the decorator on it.
"""

from __future__ import annotations

import functools
from collections import namedtuple
from collections.abc import ItemsView, MutableMapping, ValuesView
from types import MethodType

from ._vrange import (
    FillBuffer,
    PinnedBuffer,
    PinnedValue,
    PurgedError,
    VolatileBuffer,
    _Cache,
    _Cached,
    __version__,
    purge,
)

__all__ = [
    "Cache",
    "CacheInfo",
    "cached",
    "PinnedValue",
    "FillBuffer",
    "VolatileBuffer",
    "PinnedBuffer",
    "PurgedError",
    "purge",
    "__version__",
]


class _ItemsView(ItemsView):
    """Items of a `Cache`: those whose value is still there when it is read (a value purged
    or removed since the keys were listed is skipped)."""

    def __iter__(self):
        for key in self._mapping:
            try:
                yield key, self._mapping[key]
            except KeyError:
                continue


class _ValuesView(ValuesView):
    """Values of a `Cache`, skipping those purged or removed since the keys were listed."""

    def __iter__(self):
        for key in self._mapping:
            try:
                yield self._mapping[key]
            except KeyError:
                continue


class Cache(_Cache, MutableMapping):
    """A mapping of keys (`bytes`, `str`, or a picklable `tuple`) to `bytes` values, kept in
    volatile memory: the system may take any value back under memory pressure, and the cache
    then behaves as if the key had been deleted (a lookup that finds it purged raises
    `PurgedError`, a `KeyError`, once; then plain `KeyError`).

    Copy or pin: `cache[key]` (and `pop`, `setdefault`, `items()`, `values()`) returns a copy
    of the value as `bytes`, which pins nothing. `get`, `lookup` and `get_or_insert` return a
    read-only `memoryview` of the value in place, which keeps it from any purge until it is
    released (`with cache.get(k) as view:` or `view.release()`).

    Values: any C-contiguous bytes-like object (`bytes`, `bytearray`, `memoryview`,
    `array.array`), copied in. A `str` value is refused (`TypeError`): stored as its UTF-8
    bytes it would read back as `bytes`, and `cache[k] == v` would not hold; store
    `text.encode()`.

    Iteration lists the keys held at that moment and not known to be purged; a value may still
    be purged between listing its key and reading it (`items()` and `values()` skip those).
    """

    __slots__ = ()

    def __iter__(self):
        return iter(self._keys())

    def items(self):
        return _ItemsView(self)

    def values(self):
        return _ValuesView(self)

    def popitem(self):
        """Removes and returns some `(key, value)` whose value is still there; `KeyError` if
        there is none."""
        for key in self._keys():
            try:
                value = self[key]
            except KeyError:
                continue
            try:
                del self[key]
            except KeyError:
                continue
            return key, value
        raise KeyError("popitem(): the cache is empty")


CacheInfo = namedtuple("CacheInfo", ["hits", "misses", "maxsize", "currsize", "purged"])
CacheInfo.__doc__ = """What a `cached` function's `cache_info()` says: calls answered from the
cache, calls that ran the function, `maxsize` (always None: memory pressure bounds the cache,
not a count), results held now and not known to be purged (the kernel may have taken some
that no call has looked for since), and calls that ran it again because the system had taken
the result."""

_PRIORITIES = ("drop_first", "low", "normal", "drop_last")


class _CachedFunction(_Cached):
    """What `cached` makes of a function. Calling it is compiled (`_Cached`: the call's key,
    the argument → entry table, the lookup and the counters); this adds what a function
    wrapper also offers, as `functools.lru_cache`'s does: `cache_info()`, binding as a
    method, pickling and copying by reference."""

    def cache_info(self):
        hits, misses, currsize, purged = self._info()
        return CacheInfo(hits, misses, None, currsize, purged)

    def __get__(self, obj, objtype=None):
        return self if obj is None else MethodType(self, obj)

    def __reduce__(self):
        # Pickled by name, as functions are (functools.update_wrapper copied the wrapped
        # function's __qualname__ and __module__).
        return self.__qualname__

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


def cached(cache=None, *, typed=False, priority="normal"):
    """A decorator in the manner of `functools.lru_cache`: the results of the decorated
    function are kept in a `vrange.Cache`, in volatile memory, keyed by the call's arguments
    (hashable, compared by `==` as `lru_cache` compares them); a result the system took back
    under memory pressure is computed again at the next call with those arguments.

    Results: `bytes` are stored as they are; anything else must be picklable and is pickled
    (each call then returns a new object, unpickled, not the one the function returned). A
    result that is neither raises `TypeError`.

    `cache`: the `Cache` to keep the results in (default: one of its own); several functions
    may share one. `typed`: arguments of different types are cached separately. `priority`:
    the purge class of the results ("drop_first", "low", "normal", "drop_last").

    Used as `@cached` or `@cached(...)`. The wrapper has `cache_info()` (a `CacheInfo`),
    `cache_clear()`, `cache_parameters()` and `__wrapped__`. The argument → entry table is an
    ordinary dict (as `lru_cache`'s is): entries whose results were purged leave it as it
    grows.
    """
    if callable(cache) and not isinstance(cache, _Cache):
        # @cached without parentheses: `cache` is the function.
        return cached()(cache)
    if cache is not None and not isinstance(cache, _Cache):
        raise TypeError(f"cache must be a vrange.Cache, not {type(cache).__name__}")
    if not isinstance(typed, bool):
        raise TypeError(f"typed must be a bool, not {type(typed).__name__}")
    if priority not in _PRIORITIES:
        raise ValueError(f"unknown priority {priority!r}: expected one of {_PRIORITIES}")

    def decorate(func):
        store = Cache() if cache is None else cache
        return functools.update_wrapper(_CachedFunction(func, store, typed, priority), func)

    return decorate
