"""`vrange.Cache` as the mapping Python programmers use, `vrange.cached` as the decorator they
use, and both beside the tools they would otherwise pick (functools.lru_cache, cachetools),
against the real library: purges are forced with `vrange.purge(ALL)`, which purges every
volatile range of this process (anything pinned survives).
"""

import copy
import functools
import gc
import pickle
import sys
import weakref
from collections.abc import MutableMapping

import cachetools
import pytest

import vrange

ALL = 1 << 60


@pytest.fixture
def cache():
    return vrange.Cache(slab_bytes=64 << 10, probation=False)


# --- the mapping ---------------------------------------------------------------------------


def test_a_cache_is_a_mutable_mapping(cache):
    assert isinstance(cache, MutableMapping)
    cache.update({"a": b"1", b"b": bytearray(b"22")}, c=b"333")
    cache[("t", 1)] = memoryview(b"tuple")
    assert len(cache) == 4
    assert sorted(cache.keys(), key=repr) == sorted(["a", b"b", "c", ("t", 1)], key=repr)
    assert dict(cache.items()) == {"a": b"1", b"b": b"22", "c": b"333", ("t", 1): b"tuple"}
    assert sorted(cache.values()) == [b"1", b"22", b"333", b"tuple"]
    assert cache == {"a": b"1", b"b": b"22", "c": b"333", ("t", 1): b"tuple"}
    assert cache.pop("a") == b"1" and "a" not in cache
    assert cache.pop("a", None) is None
    with pytest.raises(KeyError):
        cache.pop("a")
    assert cache.setdefault("c", b"other") == b"333"
    assert cache.setdefault("d", b"4") == b"4" and cache["d"] == b"4"
    key, value = cache.popitem()
    assert key not in cache and value in (b"22", b"333", b"tuple", b"4")
    assert len(cache) == 3
    cache.clear()
    assert len(cache) == 0 and list(cache) == []
    with pytest.raises(KeyError):
        cache.popitem()


def test_reading_copies_and_get_pins(cache):
    cache["k"] = b"value"
    copy = cache["k"]
    assert type(copy) is bytes
    with cache.get("k") as view:
        assert type(view) is memoryview and view == b"value"
        assert vrange.purge(ALL) >= 0
        assert cache["k"] == b"value", "a held view keeps its value from the purge"


def test_a_str_value_is_refused_with_a_hint(cache):
    with pytest.raises(TypeError):
        cache["k"] = "text"
    assert "k" not in cache


def test_purged_entries_leave_iteration(cache):
    for i in range(20):
        cache[f"k{i}"] = bytes([i]) * 3000
    assert sorted(cache) == sorted(f"k{i}" for i in range(20))
    items = iter(cache.items())
    first_key, first_value = next(items)
    assert first_value == bytes([int(first_key[1:])]) * 3000
    assert vrange.purge(ALL) > 0
    assert list(items) == [], "values purged after the keys were listed are skipped"
    assert list(cache) == [] and len(cache) == 0 and list(cache.values()) == []
    cache["new"] = b"after"
    assert list(cache.items()) == [("new", b"after")]


def test_cachetools_cached_works_with_its_own_keys(cache):
    calls = []

    @cachetools.cached(cache=cache)
    def thumbnail(name, size=64):
        calls.append(name)
        return (name * size).encode()

    assert thumbnail("a") == b"a" * 64
    assert thumbnail("a") == b"a" * 64
    assert thumbnail("b", size=2) == b"bb"
    assert calls == ["a", "b"], "cachetools' hashkey tuples are keys"
    vrange.purge(ALL)
    assert thumbnail("a") == b"a" * 64
    assert calls == ["a", "b", "a"], "a purged result is computed again"


# --- the decorator ---------------------------------------------------------------------------


def test_cached_keeps_results_like_lru_cache():
    calls = []

    @vrange.cached
    def square(x):
        calls.append(x)
        return {"square": x * x}

    assert square(3) == {"square": 9}
    assert square(3) == {"square": 9}
    assert square(x=3) == {"square": 9}, "keywords make their own key, as in lru_cache"
    # As in lru_cache: a lone int argument is its own key, a lone float is in a tuple.
    assert square(3.0) == {"square": 9.0}
    assert calls == [3, 3, 3.0]
    info = square.cache_info()
    assert info == vrange.CacheInfo(hits=1, misses=3, maxsize=None, currsize=3, purged=0), info

    @functools.lru_cache(maxsize=None)
    def reference(x):
        return x * x

    for args, kwargs in (((3,), {}), ((3,), {}), ((), {"x": 3}), ((3.0,), {})):
        reference(*args, **kwargs)
    assert reference.cache_info()[:2] == info[:2], "the same hits and misses as lru_cache"
    assert square.__wrapped__(4) == {"square": 16} and square.__name__ == "square"
    assert square.cache_parameters() == {"maxsize": None, "typed": False, "priority": "normal"}


def test_cached_regenerates_what_the_system_took():
    calls = []
    shared = vrange.Cache(probation=False)

    @vrange.cached(shared, priority="low")
    def page(n):
        calls.append(n)
        return b"page %d " % n * 1000

    @vrange.cached(shared)
    def other(n):
        return [n]

    for n in range(10):
        assert page(n) == b"page %d " % n * 1000
        assert other(n) == [n]
    assert page(3) == b"page 3 " * 1000 and calls == list(range(10))
    assert len(shared) == 20, "two functions share one cache without mixing their keys"
    vrange.purge(ALL)
    assert page(3) == b"page 3 " * 1000
    assert calls == list(range(10)) + [3]
    info = page.cache_info()
    assert (info.hits, info.misses, info.purged) == (1, 11, 1), info
    page.cache_clear()
    assert page.cache_info() == vrange.CacheInfo(0, 0, None, 0, 0)
    assert other(1) == [1]


def test_cached_typed_and_bad_input():
    @vrange.cached(typed=True)
    def kind(x):
        return type(x).__name__.encode()

    assert kind(1) == b"int" and kind(1.0) == b"float"
    assert kind.cache_info().misses == 2

    @vrange.cached
    def unpicklable():
        return lambda: 0

    with pytest.raises(TypeError, match="neither bytes nor picklable"):
        unpicklable()
    with pytest.raises(ValueError, match="priority"):
        vrange.cached(priority="urgent")
    with pytest.raises(TypeError, match="vrange.Cache"):
        vrange.cached({})
    with pytest.raises(TypeError):
        vrange.cached()(lambda x: b"")([])  # unhashable arguments, as in lru_cache


def test_cached_results_round_trip_through_pickle():
    @vrange.cached
    def parse(text):
        return {"words": text.split(), "n": len(text)}

    first = parse("a b c")
    again = parse("a b c")
    assert first == again and first is not again, "each hit is a new object, unpickled"
    assert pickle.loads(pickle.dumps(again)) == first


@vrange.cached
def _module_level(n):
    return b"%d" % n


def test_cached_wrapper_behaves_like_a_function_wrapper():
    calls = []

    class Page:
        def __init__(self, name):
            self.name = name

        @vrange.cached
        def render(self, size):
            calls.append((self.name, size))
            return (self.name * size).encode()

    a, b = Page("a"), Page("b")
    assert a.render(2) == b"aa" and a.render(2) == b"aa" and b.render(2) == b"bb"
    assert calls == [("a", 2), ("b", 2)], "bound to each instance, the instance is in the key"
    assert Page.render.cache_info().hits == 1 and a.render.cache_info().hits == 1
    assert Page.render(a, 2) == b"aa"
    # Pickled and copied by reference, as functions (and lru_cache's wrappers) are.
    assert pickle.loads(pickle.dumps(_module_level)) is _module_level
    assert copy.copy(_module_level) is _module_level
    assert copy.deepcopy(_module_level) is _module_level
    assert _module_level.__name__ == "_module_level" and _module_level.__doc__ is None


def test_cached_keys_keywords_and_types_as_lru_cache_does():
    calls = []

    @vrange.cached(typed=True)
    def f(*args, **kwargs):
        calls.append((args, kwargs))
        return b""

    @functools.lru_cache(maxsize=None, typed=True)
    def reference(*args, **kwargs):
        return b""

    for args, kwargs in (
        ((1,), {}), ((1.0,), {}), ((1,), {}), ((), {"x": 1}), ((), {"x": 1.0}),
        ((), {"x": 1}), ((), {"x": 1, "y": 2}), ((), {"y": 2, "x": 1}), (("s",), {}),
        (("s",), {}), ((1, "s"), {"x": (1, 2)}), ((1, "s"), {"x": (1, 2)}),
    ):
        f(*args, **kwargs)
        reference(*args, **kwargs)
    assert f.cache_info()[:2] == reference.cache_info()[:2], (f.cache_info(), reference.cache_info())
    with pytest.raises(TypeError, match="unhashable"):
        f(x=[])


def test_a_cached_function_that_refers_to_itself_is_collected():
    def make():
        @vrange.cached
        def fib(n):
            return n if n < 2 else fib(n - 1) + fib(n - 2)

        assert fib(30) == 832040 and fib.cache_info().misses == 31
        return weakref.ref(fib)

    gone = make()
    gc.collect()
    assert gone() is None, "the wrapper, its function and its table form a cycle the GC sees"


def test_a_hit_never_changes_a_result_someone_still_holds():
    # A hit may write into the bytes object of the previous hit, but only when nothing else
    # holds it any more: results held, viewed or used as keys keep their bytes.
    @vrange.cached
    def page(n):
        return b"page %04d" % n  # the same length for every n

    for n in range(4):
        page(n)
    kept = page(0)
    view = memoryview(page(1))
    keyed = {page(2): "two"}
    assert (page(3), page(3)) == (b"page 0003", b"page 0003")
    assert kept == b"page 0000" and view == b"page 0001" and keyed == {b"page 0002": "two"}

    hashed = page(2)
    hashed_hash, hashed_id = hash(hashed), id(hashed)
    del hashed
    again = page(0)
    if getattr(sys, "_is_gil_enabled", lambda: True)():
        assert id(again) == hashed_id, "the dropped result's bytes object was reused"
    assert again == b"page 0000" and hash(again) == hash(b"page 0000") != hashed_hash
    assert {b"page 0000": 0}[again] == 0, "its cached hash is the new bytes'"


def test_pruning_the_table_keeps_the_call_that_set_it_off():
    # The table drops the entries whose results are gone once it holds 1,024 entries (then
    # each time it has doubled). The call that sets the pruning off has not stored its result
    # yet: its entry must stay.
    calls = []

    @vrange.cached
    def f(n):
        calls.append(n)
        return b"%d" % n

    for n in range(1023):
        f(n)
    vrange.purge(ALL)
    f(5000)
    f(5001)
    assert (f(5000), f(5001)) == (b"5000", b"5001")
    assert calls.count(5000) == calls.count(5001) == 1, "both are hits after the pruning"
    assert f.cache_info().currsize == 2 and f(7) == b"7" and calls.count(7) == 2
