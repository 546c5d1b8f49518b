"""A child memory cgroup of this process's own, for tests that need a real memory limit (root,
cgroup v1 with a memory hierarchy or v2 with the memory controller delegated). `unavailable`
says why none can be made; a test then skips, or fails under CI=true (the project's rule: a
skip under CI is a failure unless the kernel lacks the feature)."""

import errno
import os
import time

V1_ROOT = "/sys/fs/cgroup/memory"
V2_ROOT = "/sys/fs/cgroup"


def _own():
    """(directory of this process's memory cgroup, version) or a reason string."""
    with open("/proc/self/cgroup") as f:
        lines = [line.rstrip("\n").split(":", 2) for line in f]
    for _, controllers, path in lines:
        if "memory" in controllers.split(",") and os.path.isdir(V1_ROOT):
            return os.path.join(V1_ROOT, path.lstrip("/")), 1
    for hierarchy, controllers, path in lines:
        if hierarchy == "0" and controllers == "":
            d = os.path.join(V2_ROOT, path.lstrip("/"))
            try:
                with open(os.path.join(d, "cgroup.subtree_control")) as f:
                    if "memory" in f.read().split():
                        return d, 2
            except OSError:
                pass
    return "no memory cgroup this process can make children in"


def unavailable():
    """Why no child cgroup can be made here, or None."""
    if os.geteuid() != 0:
        return "needs root to make a memory cgroup"
    own = _own()
    return own if isinstance(own, str) else None


class Child:
    """A child memory cgroup with a limit; `remove()` kills what is left in it and removes it."""

    def __init__(self, name, limit):
        self.parent, self.version = _own()
        self.path = os.path.join(self.parent, f"{name}-{os.getpid()}")
        os.mkdir(self.path)
        if not self.set_limit(limit, patience=0):
            raise OSError(f"cannot set the limit of {self.path}")

    def _file(self, name):
        return os.path.join(self.path, name)

    def set_limit(self, limit, patience=5.0):
        """Sets the hard limit, as a container runtime shrinking a container would: a limit
        below the usage waits (up to `patience` seconds) for the usage to come down. On v1
        the kernel refuses it with EBUSY meanwhile (its reclaim attempt signals pressure); on
        v2 `memory.high` is lowered first (pressure, throttling) and `memory.max` only once
        the usage is under it, since a `memory.max` below the usage OOM-kills at once.
        Returns whether it was set."""
        deadline = time.monotonic() + patience
        if self.version == 2:
            self._write("memory.high", limit)
            while self.usage() > limit and time.monotonic() < deadline:
                time.sleep(0.05)
            return self.usage() <= limit and self._write("memory.max", limit)
        while True:
            try:
                with open(self._file("memory.limit_in_bytes"), "w") as f:
                    f.write(str(limit))
                return True
            except OSError as e:
                if e.errno != errno.EBUSY or time.monotonic() > deadline:
                    return False
                time.sleep(0.05)

    def _write(self, name, value):
        try:
            with open(self._file(name), "w") as f:
                f.write(str(value))
            return True
        except OSError:
            return False

    def join(self, pid):
        with open(self._file("cgroup.procs"), "w") as f:
            f.write(str(pid))

    def join_self(self):
        """For `preexec_fn`: moves the calling process (the child, before exec) in."""
        self.join(os.getpid())

    def oom_kills(self):
        name, key = ("memory.oom_control", "oom_kill") if self.version == 1 else ("memory.events", "oom_kill")
        with open(self._file(name)) as f:
            for line in f:
                k, _, v = line.partition(" ")
                if k == key:
                    return int(v)
        return 0

    def usage(self):
        name = "memory.usage_in_bytes" if self.version == 1 else "memory.current"
        with open(self._file(name)) as f:
            return int(f.read())

    def remove(self):
        for _ in range(100):
            try:
                with open(self._file("cgroup.procs")) as f:
                    pids = [int(p) for p in f.read().split()]
            except OSError:
                pids = []
            for pid in pids:
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
            try:
                os.rmdir(self.path)
                return
            except OSError:
                time.sleep(0.05)
