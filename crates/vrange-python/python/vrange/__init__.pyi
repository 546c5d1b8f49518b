"""Volatile memory for Python: a cache whose values the system may take back under memory
pressure (`Cache`, a mutable mapping), a decorator that keeps a function's results there
(`cached`), buffers that may be purged while not pinned (`VolatileBuffer`), and
`purge(nbytes)` to give memory back now.

Type information for the `vrange` package (shipped with a `py.typed` marker); checked against
the installed package by `mypy.stubtest` in the package's checks (ci.sh).
"""

import sys
from collections.abc import Callable, ItemsView, Iterator, MutableMapping, ValuesView
from types import TracebackType
from typing import Any, Generic, Literal, NamedTuple, TypeVar, Union, final, overload

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

__version__: str

_Key = Union[bytes, str, tuple[Any, ...]]
_Priority = Literal["drop_first", "low", "normal", "drop_last"]
_T = TypeVar("_T")
_R = TypeVar("_R")

if sys.version_info >= (3, 12):
    from collections.abc import Buffer as _Buffer
else:
    from typing_extensions import Buffer as _Buffer
from typing_extensions import disjoint_base

if sys.version_info >= (3, 11):
    from typing import Self
else:
    from typing_extensions import Self

class PurgedError(KeyError):
    """The value under this key was purged by the system under memory pressure. A subclass of
    KeyError; the entry is dropped, so the next lookup of the key raises a plain KeyError."""

@final
class PinnedValue:
    """A cached value, pinned while this object lives (the `obj` of the memoryview a lookup
    returns). Made by the cache only."""

    def __len__(self) -> int: ...
    @property
    def priority(self) -> _Priority: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...

@final
class FillBuffer:
    """The writable buffer `Cache.get_or_insert` hands its fill function (valid only during
    the call)."""

    def __len__(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...

@disjoint_base
class _Cache:
    """The compiled cache `Cache` is built on."""

    def __new__(
        cls,
        slab_bytes: int | None = None,
        budget: int | None = None,
        probation: bool = True,
    ) -> Self: ...
    @property
    def slab_bytes(self) -> int: ...
    @property
    def budget(self) -> int | None: ...
    def put(self, key: _Key, value: _Buffer, priority: _Priority = ...) -> None: ...
    def __setitem__(self, key: _Key, value: _Buffer, /) -> None: ...
    def get(self, key: _Key, default: _T | None = None) -> memoryview | _T | None: ...
    def __getitem__(self, key: _Key, /) -> bytes: ...
    def lookup(
        self, key: _Key
    ) -> tuple[memoryview, Literal["hit"]] | tuple[None, Literal["absent", "purged"]]: ...
    def __delitem__(self, key: _Key, /) -> None: ...
    def __contains__(self, key: object, /) -> bool: ...
    def __len__(self) -> int: ...
    def _keys(self) -> list[_Key]: ...
    def clear(self) -> None: ...
    def get_or_insert(
        self,
        key: _Key,
        size: int,
        fill: Callable[[memoryview], object],
        priority: _Priority = ...,
    ) -> memoryview: ...
    def stats(self) -> dict[str, Any]: ...

class Cache(_Cache, MutableMapping[_Key, bytes]):  # type: ignore[misc]
    """A mapping of keys (bytes, str or a picklable tuple) to bytes values in volatile
    memory. `cache[key]` copies; `get`, `lookup` and `get_or_insert` pin a view."""

    def __iter__(self) -> Iterator[_Key]: ...
    def items(self) -> ItemsView[_Key, bytes]: ...
    def values(self) -> ValuesView[bytes]: ...
    def popitem(self) -> tuple[_Key, bytes]: ...

class CacheInfo(NamedTuple):
    hits: int
    misses: int
    maxsize: None
    currsize: int
    purged: int

class _CachedFunction(Generic[_R]):
    """What `cached` makes of a function."""

    __wrapped__: Callable[..., _R]
    def __call__(self, *args: Any, **kwargs: Any) -> _R: ...
    def cache_info(self) -> CacheInfo: ...
    def cache_clear(self) -> None: ...
    def cache_parameters(self) -> dict[str, Any]: ...
    # Bound to an instance it is a method object that forwards these attributes (as a
    # function's would); typed as the wrapper itself, as typeshed types lru_cache's.
    def __get__(self, obj: object, objtype: type | None = None) -> _CachedFunction[_R]: ...
    def __copy__(self) -> _CachedFunction[_R]: ...
    def __deepcopy__(self, memo: Any, /) -> _CachedFunction[_R]: ...

@overload
def cached(cache: Callable[..., _R], /) -> _CachedFunction[_R]: ...
@overload
def cached(
    cache: Cache | None = None, *, typed: bool = False, priority: _Priority = "normal"
) -> Callable[[Callable[..., _R]], _CachedFunction[_R]]: ...

@final
class PinnedBuffer:
    """A pin on a VolatileBuffer (a context manager): its bytes stay until `unpin`."""

    @property
    def purged(self) -> bool: ...
    @property
    def active(self) -> bool: ...
    def unpin(self) -> None: ...
    def __enter__(self) -> PinnedBuffer: ...
    def __exit__(
        self,
        *_exc: type[BaseException] | BaseException | TracebackType | None,
    ) -> bool: ...
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...

@final
class VolatileBuffer:
    """`size` bytes of volatile memory: the system may purge them while no pin holds them."""

    def __new__(cls, size: int) -> VolatileBuffer: ...
    def pin(self) -> PinnedBuffer: ...
    @property
    def pinned(self) -> bool: ...
    def __len__(self) -> int: ...

def purge(nbytes: int) -> int:
    """Purges at least `nbytes` bytes of this process's volatile memory now; returns the bytes
    freed."""
