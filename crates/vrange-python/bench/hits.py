"""The hit path of vrange's Python caches beside what Python programmers use today: the time of
one call that is answered from the cache (µs per hit), every cache in the same run, each
measured in turn, REPEATS times, reporting the median.

    python3 crates/vrange-python/bench/hits.py [--values N] [--size BYTES] [--repeats R]

Needs `vrange` (installed) and `cachetools`. Every cache holds the same N results of SIZE
bytes (default 1,000 of 1 KiB), all hits (the cache is filled first); the calls go over the
keys in a fixed shuffled order, and each result is dropped before the next call, except in
the row that keeps it.
"""

import argparse
import functools
import platform
import random
import statistics
import time

import cachetools

import vrange


def make(i, size):
    return bytes([i % 251]) * size


def timed(call, keys, repeats):
    """Median µs per call over `repeats` passes over `keys` (after one warm-up pass)."""
    for k in keys:
        call(k)
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for k in keys:
            call(k)
        runs.append((time.perf_counter() - t0) / len(keys) * 1e6)
    return statistics.median(runs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--values", type=int, default=1000)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    n, size = args.values, args.size
    keys = list(range(n))
    random.Random(1).shuffle(keys)

    @functools.lru_cache(maxsize=None)
    def lru(i):
        return make(i, size)

    @cachetools.cached(cachetools.LRUCache(maxsize=n))
    def ct(i):
        return make(i, size)

    @vrange.cached
    def vr_bytes(i):
        return make(i, size)

    @vrange.cached
    def vr_pickled(i):
        return {"i": i, "data": make(i, size)}

    plain = {i: make(i, size) for i in keys}
    cache = vrange.Cache()
    for i in keys:
        cache[str(i)] = make(i, size)
    str_keys = {i: str(i) for i in keys}

    def view(i):
        with cache.get(str_keys[i]) as v:
            return len(v)

    # A caller that still holds the previous result when it calls again: vrange.cached then
    # cannot reuse that result's bytes object for the next hit, and makes a new one.
    held = [None]

    def vr_kept(i):
        held[0] = vr_bytes(i)

    rows = [
        ("functools.lru_cache (decorator)", lambda i: lru(i)),
        ("cachetools.cached(LRUCache) (decorator)", lambda i: ct(i)),
        ("vrange.cached, bytes results (decorator)", lambda i: vr_bytes(i)),
        ("vrange.cached, bytes results, each kept until the next call", vr_kept),
        ("vrange.cached, pickled dict results (decorator)", lambda i: vr_pickled(i)),
        ("dict: d[k]", lambda i: plain[i]),
        ("vrange.Cache: cache[k] (a bytes copy)", lambda i: cache[str_keys[i]]),
        ("vrange.Cache: with cache.get(k) (a pinned view)", view),
    ]
    print(
        f"hits: {n} values of {size} bytes, median of {args.repeats} passes; "
        f"Python {platform.python_version()}, vrange {vrange.__version__}"
    )
    print()
    print("| cache | µs per hit | × functools.lru_cache |")
    print("|---|---|---|")
    base = None
    for name, call in rows:
        us = timed(call, keys, args.repeats)
        base = base or us
        print(f"| {name} | {us:.3f} | {us / base:.2f}× |")


if __name__ == "__main__":
    main()
