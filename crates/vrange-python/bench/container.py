"""The thumbnail service (examples/thumbnails.py) in a container that is shrunk while it serves,
with each cache a Python programmer would pick, all in one run: random requests for 8 s over
2,400 thumbnails of 64 KiB (150 MiB) in a memory cgroup of 128 MiB whose limit is lowered by
16 MiB every second down to 48 MiB (tests/scenario.py). Per cache, over TRIALS trials:
requests answered (until the end, or until an OOM kill ended the service), hit rate (of a
service alive at the end), OOM kills, the limit steps the container could take, wrong bytes.

    python3 crates/vrange-python/bench/container.py [--trials 3]

Needs root and a memory cgroup (v1, or v2 with the memory controller delegated), `vrange`
installed, and `cachetools`.
"""

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import memcg  # noqa: E402
from scenario import LIMITS, MIB, scenario  # noqa: E402

SECONDS = 8.0
CACHES = [
    ("vrange.cached", "vrange", 0),
    ("functools.lru_cache(maxsize=None)", "lru", 0),
    ("cachetools.LRUCache(1600): 100 MiB of thumbnails", "cachetools", 1600),
    ("cachetools.LRUCache(500): 31 MiB of thumbnails", "cachetools", 500),
    ("cachetools.LRUCache(250): 16 MiB of thumbnails", "cachetools", 250),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=3)
    args = ap.parse_args()
    why = memcg.unavailable()
    if why:
        print(f"container: {why}", file=sys.stderr)
        return 2
    print(f"container: {SECONDS:.0f} s of random requests, limit 128 MiB lowered each second to "
          f"{', '.join(str(l // MIB) for l in LIMITS)} MiB; {args.trials} trial(s), medians")
    print()
    print("| cache | requests answered | hit rate | OOM kills (all trials) | limit steps taken | wrong |")
    print("|---|---|---|---|---|---|")
    for name, kind, maxsize in CACHES:
        runs = [scenario(kind, shrink=True, maxsize=maxsize, seconds=SECONDS) for _ in range(args.trials)]
        # Until the end, or until the service was killed.
        served = statistics.median(r["served"] for r in runs)
        hits = [r["stats"]["hits"] / max(1, r["stats"]["hits"] + r["stats"]["misses"])
                for r in runs if r["stats"]]
        hit = f"{statistics.median(hits):.0%}" if hits else "– (killed)"
        kills = sum(r["oom_kills"] for r in runs)
        taken = statistics.median(sum(ok for _, ok in r["lowered"]) for r in runs)
        wrong = sum(r["wrong"] for r in runs)
        print(f"| {name} | {served:.0f} | {hit} | {kills} | {taken:.0f} of {len(LIMITS)} | {wrong} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
