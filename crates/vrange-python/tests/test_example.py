"""examples/thumbnails.py, the web handler a Python programmer would write, run for real in a
memory cgroup (tests/scenario.py): with `@vrange.cached` it keeps serving right bytes while its
container is shrunk from 128 to 48 MiB, giving thumbnails back and making them again; with
`functools.lru_cache(maxsize=None)` the same service is OOM-killed at the first limit."""

import os

import pytest

import memcg
from scenario import LIMITS, scenario


def need_cgroup():
    why = memcg.unavailable()
    if why:
        if os.environ.get("CI") == "true":
            pytest.fail(f"skipped under CI: {why}")
        pytest.skip(why)


def test_the_vrange_service_keeps_serving_while_its_container_shrinks():
    need_cgroup()
    r = scenario("vrange", shrink=True, each_once=True)
    print(r)
    assert r["alive"] and r["oom_kills"] == 0, r
    assert r["wrong"] == 0 and r["served"] > 500, r
    assert [ok for _, ok in r["lowered"]] == [True] * len(LIMITS), (
        "every lower limit was taken: the cache gave memory back", r)
    assert r["stats"]["purged"] > 0 and r["stats"]["hits"] > 0, r


def test_the_same_service_with_lru_cache_is_oom_killed():
    need_cgroup()
    r = scenario("lru", shrink=False, each_once=True)
    print(r)
    assert not r["alive"] and r["oom_kills"] >= 1, (
        "150 MiB of thumbnails do not fit a 128 MiB container without giving any back", r)
