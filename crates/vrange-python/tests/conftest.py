"""Test settings, applied before the module is loaded (vrange reads its VRANGE_* settings once).

The tests check what explicit purges (`vrange.purge`) do, so memory pressure elsewhere on the
machine must not purge a value between a test's insert and its lookup: the pressure sources
(PSI, cgroup v1 vmpressure events, cgroup headroom) are off unless the environment sets them.
The reclaimer thread still runs (its tick flushes the cache's idle slabs and arms hybrid ones).
"""

import os

for name in ("VRANGE_PSI", "VRANGE_VMPRESSURE", "VRANGE_HEADROOM"):
    os.environ.setdefault(name, "off")
