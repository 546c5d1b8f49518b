"""Proves that libvrange_malloc.so is invisible to a real program: runs part of CPython's own
regression suite (Debian's libpython3.11-testsuite, under /usr/bin/python3) plainly, under the
shim, and under the shim with VRANGE_MALLOC_THRESHOLD=16K, and fails unless every test case ends
the same way (pass, fail, error, skip, expected failure, unexpected success, or not run at all)
in each shim run as in the plain run. A case that ends differently is run again alone, three
times in each configuration: if both then show an outcome in common, it is timing-sensitive on
this machine (on a busy one, tests that sleep and count, such as multiprocessing's
test_notify, fail now and then in either configuration) and is listed, not counted; if not,
the difference stands and the comparison fails.

Run through compare.sh beside it, which checks the prerequisites and builds the shim:
    tests/cpython/compare.sh [path/to/libvrange_malloc.so] [--plain-twice]
--plain-twice runs the plain configuration a second time and compares it with the first too:
that is how the suite's own flakiness on this machine is measured (see FLAKY).

That the shim really was in use cannot be taken on trust (the loader ignores a bad LD_PRELOAD
with a mere warning, and a worker could be started without it), so while each run goes on the
regrtest process and every worker it starts are watched through /proc: in shim runs each must
have the shim mapped and carry the run's variables, in the plain run none may. A separate small
process with VRANGE_MALLOC_STATS=1 shows that each configuration's allocator serves requests
(not the test processes: the summary would add a descriptor and stderr output to them).
"""

import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET

PYTHON = "/usr/bin/python3"

# The seven modules first (the slow ones lead, so -j2 keeps both workers busy), then
# cheap ones that allocate and free large buffers, fork, or use signals and descriptors.
# Left out: test_socket (hangs here without a network), test_concurrent_futures (2.5 min).
# VRANGE_CPYTHON_TESTS="test_a test_b" runs those instead (to look into one quickly).
TESTS = (os.environ.get("VRANGE_CPYTHON_TESTS") or """
    test_multiprocessing_fork test_signal test_io test_subprocess test_threading test_os
    test_posix test_mmap test_pickle test_bz2 test_lzma test_zlib test_bytes test_json
    test_array test_memoryview test_re test_fcntl test_select test_fileio test_memoryio
    test_struct test_hashlib test_faulthandler test_resource test_pty test_fork1
    test_tracemalloc test_gc
""").split()

# Test ids whose outcome differed between two plain runs on this machine, so a difference in
# them says nothing about the shim. Each names why; nothing else is excluded.
FLAKY = {}

CONFIGS = {
    "plain": {},
    "shim": {"LD_PRELOAD": None},
    "shim 16K": {"LD_PRELOAD": None, "VRANGE_MALLOC_THRESHOLD": "16K"},
}
VARS = ("LD_PRELOAD", "VRANGE_MALLOC_THRESHOLD")


def base_env():
    """This environment without anything that would change how python or the shim behave."""
    drop = ("LD_PRELOAD", "VRANGE_", "PYTHON")
    return {k: v for k, v in os.environ.items() if not k.startswith(drop)}


def run_env(config, shim):
    env = base_env()
    for k, v in CONFIGS[config].items():
        env[k] = shim if v is None else v
    return env


def parent_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


class Watcher(threading.Thread):
    """Records, for the regrtest process and each worker it starts, whether the shim is mapped
    and which of the run's variables it carries."""

    def __init__(self, pid, shim, env):
        super().__init__(daemon=True)
        self.pid, self.shim, self.env = pid, shim, env
        self.seen = {}  # pid -> (shim mapped, run's variables present), once the loader is done
        self.stop = threading.Event()

    def look(self, pid):
        with open(f"/proc/{pid}/maps") as f:
            maps = f.read()
        if self.shim in maps:
            mapped = True
        elif "/libc.so" in maps:  # LD_PRELOAD objects are mapped before libc: loader is done
            mapped = False
        else:
            return  # between execve and the loader's work; look again later
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = set(f.read().split(b"\0"))
        wanted = {f"{k}={v}".encode() for k, v in self.env.items() if k in VARS}
        self.seen[pid] = (mapped, wanted <= environ)

    def scan(self):
        pids = [self.pid]
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) not in self.seen:
                try:
                    if parent_of(name) == self.pid:
                        with open(f"/proc/{name}/cmdline", "rb") as f:
                            if b"--worker-args" in f.read():  # regrtest's worker, after exec
                                pids.append(int(name))
                except OSError:
                    pass
        for pid in pids:
            if pid not in self.seen:
                try:
                    self.look(pid)
                except OSError:
                    pass

    def run(self):
        while not self.stop.wait(0.2):
            self.scan()

    def verdict(self, want_shim):
        """None if every process seen was as wanted, else why not."""
        if self.pid not in self.seen:
            return "the regrtest process was never seen"
        wrong = [p for p, (mapped, vars_ok) in self.seen.items()
                 if mapped != want_shim or not vars_ok]
        if wrong:
            how = "without the shim or its variables" if want_shim else "with the shim"
            return f"{len(wrong)} of the {len(self.seen)} processes seen ran {how}"
        if len(self.seen) == 1:
            return "no worker was seen"
        return None


def outcomes(xml_path):
    """Test id -> outcome, plus id -> message for the ones that did not pass."""
    result, message = {}, {}
    root = ET.parse(xml_path).getroot()
    for suite in root.iter("testsuite"):
        previous = "the module's first test"
        for case in suite.iter("testcase"):
            name = case.get("name")
            if name is None:
                # RegressionTestResult names a test case only when it reports it; one whose
                # subtest failed is never reported, so all there is is its place.
                name = f"(the test after {previous}: a subtest failed)"
                result[name] = "subtest failure"
                continue
            previous = name
            tags = {child.tag: child for child in case}
            kind = next((k for k in ("error", "failure", "skipped", "output", "outcome")
                         if k in tags), None)
            result[name] = {None: "pass", "output": "expected failure",
                            "outcome": "unexpected success"}.get(kind, kind)
            if kind in ("error", "failure"):
                message[name] = tags[kind].get("message", "").strip()
    return result, message


MODULE_LINE = re.compile(r"\[\s*\d+/\d+(?:/\d+)?\] (test_\w+) (.*?)(?: -- running: .*)?$")


def module_results(log):
    """Module -> regrtest's one-line result, durations and counts taken out."""
    result = {}
    for line in log.splitlines():
        m = MODULE_LINE.search(line)
        if m:
            status = re.sub(r" \((?:[\d.]+ (?:min|sec)[^)]*|\d+ (?:failure|error)[^)]*)\)", "",
                            m.group(2))
            result[m.group(1)] = status
    return result


def run(config, shim, workdir, tag, tests=TESTS, match=None):
    env = run_env(config, shim)
    xml_path = os.path.join(workdir, f"{tag}.xml")
    log_path = os.path.join(workdir, f"{tag}.log")
    only = ["-m", match] if match else []
    cmd = [PYTHON, "-m", "test", "-j2", "-u", "cpu", "--timeout", "300",
           "--junit-xml", xml_path, *only, *tests]
    shown = [f"{k}={v}" for k, v in env.items() if k in VARS] + cmd[:9]
    print(f"== {tag}: {' '.join(shown)} ... ({len(tests)} modules)", flush=True)
    start = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
        watcher = Watcher(proc.pid, shim, env)
        watcher.start()
        timed_out = False
        try:
            proc.wait(timeout=1800)  # regrtest's own --timeout should end a hung module first
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.send_signal(signal.SIGINT)  # regrtest stops its workers on ^C
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                for pid in watcher.seen:  # workers run in sessions of their own
                    os.kill(pid, signal.SIGKILL)
                proc.wait()
        watcher.stop.set()
        watcher.join()
    took = time.monotonic() - start
    with open(log_path) as f:
        log_text = f.read()
    print(f"   {took:.0f} s, regrtest exit {proc.returncode}; log: {log_path}")
    problems = ["regrtest did not finish in 30 minutes"] if timed_out else []
    why = watcher.verdict(want_shim=config != "plain")
    if why:
        problems.append(f"shim check: {why}")
    else:
        print(f"   shim check: {'all' if config != 'plain' else 'none of'} the regrtest process "
              f"and {len(watcher.seen) - 1} workers seen had the shim mapped")
    if os.path.exists(xml_path):
        cases, messages = outcomes(xml_path)
    else:
        cases, messages = {}, {}
        problems.append("regrtest wrote no junit xml; its log ends:\n" + log_text[-2000:])
    modules = module_results(log_text)
    missing = [t for t in tests if t not in modules]
    if missing or not cases:
        problems.append(f"no result for {' '.join(missing) or 'any test case'}; log ends:\n"
                        + log_text[-2000:])
    counts = {}
    for o in cases.values():
        counts[o] = counts.get(o, 0) + 1
    print("   " + ", ".join(f"{n} {o}" for o, n in sorted(counts.items())))
    return {"cases": cases, "messages": messages, "modules": modules,
            "problems": problems, "seconds": took}


def stats_check(config, shim):
    """Runs a small python under the configuration with VRANGE_MALLOC_STATS=1 and returns the
    number of allocations the shim served (None if it printed no summary)."""
    env = dict(run_env(config, shim), VRANGE_MALLOC_STATS="1")
    code = "b = [bytearray(20000) for _ in range(100)]; c = [bytearray(1 << 20) for _ in range(5)]"
    p = subprocess.run([PYTHON, "-c", code], env=env, capture_output=True, text=True)
    m = re.search(r"vrange-malloc: (\d+) allocations", p.stderr)
    return int(m.group(1)) if m else None


# Runs of each configuration that settle a test case whose outcome differed (see `settle`).
RERUNS = 3


def settle(case, config, shim, workdir, first):
    """The outcomes of `case` (a test id such as test.test_x.Class.test_y) in RERUNS runs of
    it alone under `config`, with `first` (its outcome in the full run)."""
    module = case.split(".")[1] if case.startswith("test.") else None
    seen = {first}
    if module is None:  # a subtest failure's place, not a runnable id
        return seen
    for i in range(RERUNS):
        tag = f"rerun-{config.replace(' ', '-')}-{abs(hash(case)) % 10**8}-{i}"
        r = run(config, shim, workdir, tag, tests=[module], match=case)
        if not r["problems"]:  # a rerun whose shim check failed is no evidence either way
            seen.add(r["cases"].get(case, "not run"))
    return seen


def compare(name, base, other, rerun=None):
    """Prints the differences of `other` from `base`; returns whether there were none.

    A test case whose outcome differs is run again alone, RERUNS times in each configuration
    (`rerun(case, which, first)` returns the outcomes seen, `which` being "base" or "other").
    If both configurations then show an outcome in common, the case is timing-sensitive on
    this machine (a test that sleeps and counts, under load) and says nothing about the shim:
    it is listed as such and not counted. Otherwise the difference stands. A module's one-line
    result differs with its cases: it stands only if one of its differing cases does."""
    diffs, flaky, standing = [], [], set()
    for case in sorted(set(base["cases"]) | set(other["cases"])):
        a, b = base["cases"].get(case, "not run"), other["cases"].get(case, "not run")
        if a != b and case not in FLAKY and rerun is not None:
            seen_a, seen_b = rerun(case, "base", a), rerun(case, "other", b)
            if seen_a & seen_b:
                flaky.append(f"{case}: {a} -> {b}; run alone {RERUNS} times more: "
                             f"{sorted(seen_a)} plainly, {sorted(seen_b)} here")
                continue
        if a != b and case not in FLAKY:
            standing.add(case.split(".")[1] if case.startswith("test.") else None)
            diffs.append(f"{case}: {a} -> {b}")
            msg = other["messages"].get(case) or base["messages"].get(case)
            if msg:
                lines = [line[:160] for line in msg.splitlines() if line.strip()]
                if len(lines) > 12:  # a child's command line, then its stdout and stderr
                    lines = lines[:2] + ["..."] + lines[-8:]
                diffs.extend("      " + line for line in lines)
    for module in sorted(set(base["modules"]) | set(other["modules"])):
        a, b = base["modules"].get(module, "not run"), other["modules"].get(module, "not run")
        excused = flaky and module not in standing and None not in standing and any(
            f.startswith(f"test.{module}.") for f in flaky)
        if a != b and not excused:
            diffs.insert(0, f"{module} (module): {a} -> {b}")
    problems = other["problems"] + base["problems"]
    status = "FAILED" if diffs or problems else "identical"
    if flaky and not (diffs or problems):
        status = "identical but for timing-sensitive cases"
    print(f"-- {name}: {status}")
    for line in problems + diffs:
        print("   " + line)
    for line in flaky:
        print("   timing-sensitive here, not counted: " + line)
    return not (diffs or problems)


def main():
    paths = [a for a in sys.argv[1:] if a != "--plain-twice"]
    if len(paths) != 1:
        sys.exit(f"usage: {sys.argv[0]} path/to/libvrange_malloc.so [--plain-twice]")
    shim = os.path.realpath(paths[0])
    runs = [("plain", "plain")]
    if "--plain-twice" in sys.argv:
        runs.append(("plain again", "plain"))
    runs += [("shim", "shim"), ("shim 16K", "shim 16K")]
    workdir = tempfile.mkdtemp(prefix="vrange-cpython-")
    results = {}
    for name, config in runs:
        results[name] = run(config, shim, workdir, name.replace(" ", "-"))
        if config != "plain":
            n = stats_check(config, shim)
            print(f"   a small python with these variables: vrange-malloc served {n} allocations")
            if not n or (config == "shim 16K" and n < 100):  # its 100 20000-byte buffers
                results[name]["problems"].append(f"stats check: the shim served {n} allocations")
    passed = failed = 0
    settled = {}  # (case, config) -> outcomes: the plain reruns serve every comparison
    for name, config in runs:
        if name != "plain":
            def rerun(case, which, first, config=config):
                key = (case, "plain" if which == "base" else config)
                if key not in settled:
                    settled[key] = settle(case, key[1], shim, workdir, first)
                return settled[key]
            if compare(f"{name} vs plain", results["plain"], results[name], rerun):
                passed += 1
            else:
                failed += 1
    print("run times: " + ", ".join(f"{k} {r['seconds']:.0f} s" for k, r in results.items()))
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
