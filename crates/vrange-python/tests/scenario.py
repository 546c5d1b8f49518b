"""The thumbnail service of examples/thumbnails.py in a memory cgroup: random requests for
8 s, the container's limit lowered a step each second if asked; what happened. Shared by
tests/test_example.py and bench/container.py."""

import importlib.util
import json
import random
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import memcg

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "thumbnails.py"
MIB = 1 << 20
DISTINCT = 2400  # thumbnails of 64 KiB: 150 MiB in all
FIRST_LIMIT = 128 * MIB
LIMITS = [112 * MIB, 96 * MIB, 80 * MIB, 64 * MIB, 48 * MIB]
# Random requests served at the least after the thumbnails each once, however long that took:
# so many that some ask for a thumbnail still held (the test's hits), whatever the machine's
# speed (on a busy machine the first pass alone took more than the 8 s).
MIN_RANDOM = 300


def render():
    spec = importlib.util.spec_from_file_location("thumbnails", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.render


def fetch(port, path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=20) as r:
        return r.read()


def serve(kind, cg, maxsize):
    p = subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--port", "0", "--cache", kind, "--maxsize", str(maxsize)],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=cg.join_self,
    )
    line = p.stdout.readline()
    assert line.startswith("serving on port "), line
    return p, int(line.split()[-1])


def scenario(kind, shrink, maxsize=1000, seconds=8.0, each_once=False):
    """Serves thumbnails (lowering the limit a step every second if `shrink`): with
    `each_once`, every thumbnail once, in order, first (150 MiB through the service whatever
    the machine's speed); then random ones until `seconds` have passed, every step is taken and
    at least `MIN_RANDOM` were served. Returns what happened."""
    make = render()
    cg = memcg.Child(f"vrange-py-thumbs-{kind}", FIRST_LIMIT)
    p = None
    try:
        p, port = serve(kind, cg, maxsize)
        rng = random.Random(7)
        served = wrong = 0
        steps = list(LIMITS) if shrink else []
        lowered = []
        next_step = time.monotonic() + 1.0
        deadline = time.monotonic() + seconds
        order = iter(range(DISTINCT) if each_once else ())
        random_served = 0
        while p.poll() is None:
            n = next(order, None)
            if n is None:
                if time.monotonic() >= deadline and not steps and random_served >= MIN_RANDOM:
                    break
                n = rng.randrange(DISTINCT)
                random_served += 1
            try:
                body = fetch(port, f"/thumb/{n}")
            except OSError:
                # The server died mid-answer (an OOM kill) or cannot answer: see which.
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    raise
                break
            served += 1
            wrong += body != make(n)
            if steps and time.monotonic() >= next_step:
                limit = steps.pop(0)
                lowered.append((limit // MIB, cg.set_limit(limit, patience=5.0)))
                next_step = time.monotonic() + 1.0
        alive = p.poll() is None
        stats = json.loads(fetch(port, "/stats")) if alive else {}
        return {"served": served, "wrong": wrong, "alive": alive, "oom_kills": cg.oom_kills(),
                "lowered": lowered, "stats": stats}
    finally:
        if p is not None and p.poll() is None:
            p.kill()
            p.wait()
        cg.remove()
