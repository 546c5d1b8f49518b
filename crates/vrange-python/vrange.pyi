"""Volatile memory for Python: a cache whose values the system may take back under memory
pressure (`Cache`), buffers that may be purged while not pinned (`VolatileBuffer`), and
`purge(nbytes)` to give memory back now.

Type information for the `vrange` extension module (maturin ships it as
`vrange/__init__.pyi` with a `py.typed` marker); checked against the module by
`mypy.stubtest` in the package's tests.
"""

import sys
from collections.abc import Callable
from types import TracebackType
from typing import Any, Literal, NoReturn, TypeVar, Union, final

__all__ = [
    "Cache",
    "PinnedValue",
    "FillBuffer",
    "VolatileBuffer",
    "PinnedBuffer",
    "PurgedError",
    "purge",
    "__version__",
]

__version__: str

_Key = Union[bytes, str]
_Priority = Literal["drop_first", "low", "normal", "drop_last"]
_T = TypeVar("_T")

if sys.version_info >= (3, 12):
    from collections.abc import Buffer as _Buffer
else:
    from typing_extensions import Buffer as _Buffer

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

@final
class Cache:
    """A key -> bytes cache whose values the system may purge under memory pressure. Keys are
    bytes or str; values any C-contiguous bytes-like object, copied in."""

    def __new__(
        cls,
        slab_bytes: int | None = None,
        budget: int | None = None,
        probation: bool = True,
    ) -> Cache: ...
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
    def __iter__(self) -> NoReturn:
        """Raises TypeError: the cache does not list its keys."""
    def clear(self) -> None: ...
    def get_or_insert(
        self,
        key: _Key,
        size: int,
        fill: Callable[[memoryview], object],
        priority: _Priority = ...,
    ) -> memoryview: ...
    def stats(self) -> dict[str, Any]: ...

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
