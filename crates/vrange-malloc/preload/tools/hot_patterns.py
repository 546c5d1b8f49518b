#!/usr/bin/env python3
"""Prints hot.ld's input-section patterns for the functions of the shim that programs ran.

Usage: hot_patterns.py SHIM.so CALLGRIND.OUT...

Each CALLGRIND.OUT is `valgrind --tool=callgrind --demangle=no` of a program run with the shim
preloaded (LD_PRELOAD=SHIM.so valgrind ...): every function of the shim such a run entered is
named in it. A pattern drops what changes from build to build (a legacy symbol's hash, a v0
symbol's crate disambiguators, an LTO suffix), so a rebuild keeps matching; a pattern that
stops matching costs resident memory, never correctness (tests/footprint.rs measures it).
Functions are printed in address order of the shim given, so the group keeps callers near
their callees as the default layout had them.
"""
import re
import subprocess
import sys


def executed(paths, shim_name):
    """Names of the functions of the object `shim_name` entered in the callgrind files."""
    names = set()
    line_re = re.compile(r"^(ob|cob|fn|cfn)=\((\d+)\)(?: (.*))?$")
    for path in paths:
        objects, functions = {}, {}
        ob = cob = None
        with open(path, errors="replace") as f:
            for line in f:
                m = line_re.match(line.rstrip("\n"))
                if not m:
                    continue
                kind, ident, name = m.groups()
                if kind in ("ob", "cob"):
                    if name:
                        objects[ident] = name
                    if kind == "ob":
                        ob, cob = objects[ident], None
                    else:
                        cob = objects[ident]
                    continue
                if name:
                    functions[ident] = name
                obj = ob if kind == "fn" else (cob or ob)
                if obj and obj.endswith(shim_name):
                    names.add(functions[ident])
                if kind == "fn":
                    cob = None
    return names


def pattern(name):
    """The section pattern of a function: stable parts only, glob characters elsewhere."""
    name = re.sub(r"\.llvm\.\d+$", "", name)
    name = re.sub(r"17h[0-9a-f]{16}E$", "", name)  # legacy mangling's hash
    name = re.sub(r"Cs[0-9A-Za-z]+_", "Cs*", name)  # v0 crate disambiguators
    name = re.sub(r"[^A-Za-z0-9_*]+", "*", name)
    return "*(.text*" + re.sub(r"\*+", "*", name) + "*)"


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    shim, outs = sys.argv[1], sys.argv[2:]
    addr = {}
    nm = subprocess.run(["nm", "--defined-only", shim], capture_output=True, text=True, check=True)
    for line in nm.stdout.splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[1] in "tTwW":
            addr.setdefault(fields[2], int(fields[0], 16))
    names = [n for n in executed(outs, shim.rsplit("/", 1)[-1]) if n in addr]
    seen = set()
    for name in sorted(names, key=addr.get):
        p = pattern(name)
        if p not in seen:
            seen.add(p)
            print("    " + p)


if __name__ == "__main__":
    main()
