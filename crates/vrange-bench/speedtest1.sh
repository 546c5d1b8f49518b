#!/usr/bin/env bash
# SQLite's own speedtest1 with SQLite's default page cache and with vrange_sqlite_pcache(),
# alternating which goes first, `--verify`: each run's wall time (speedtest1's TOTAL), CPU
# time and verification hash, then the medians and the ratio. speedtest1.c is SQLite's
# (test/speedtest1.c of its source tree); it is not kept here: pass its path.
#
#   cargo build --release -p vrange-ffi
#   crates/vrange-bench/speedtest1.sh PATH/TO/speedtest1.c [ROUNDS] [SIZE] [speedtest1 args...]
#
# ROUNDS defaults to 5, SIZE (speedtest1's --size) to 50; --cachesize 20000 always (80 MiB of
# 4 KiB pages: the whole database). Built against the system's SQLite (libsqlite3-dev); vrange's
# cache is installed by a preloaded constructor (c/sqlite_pcache_preload.c) that calls
# sqlite3_config(SQLITE_CONFIG_PCACHE2, vrange_sqlite_pcache()) before SQLite initializes.
set -euo pipefail
src=${1:?usage: speedtest1.sh PATH/TO/speedtest1.c [ROUNDS] [SIZE] [args...]}
rounds=${2:-5}
size=${3:-50}
shift $(($# < 3 ? $# : 3))
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
lib=$root/target/release
[ -e "$lib/libvrange.so" ] || { echo "no $lib/libvrange.so: cargo build --release -p vrange-ffi" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A newer speedtest1.c names a configuration option (1018, SQLite 3.42) older headers lack; an
# older SQLite refuses the option at run time, which speedtest1 ignores.
grep -q SQLITE_DBCONFIG_STMT_SCANSTATUS /usr/include/sqlite3.h || defs=-DSQLITE_DBCONFIG_STMT_SCANSTATUS=1018
gcc -O2 ${defs:-} -o "$work/speedtest1" "$src" -lsqlite3 -lm
gcc -O2 -shared -fPIC -o "$work/preload.so" "$here/c/sqlite_pcache_preload.c" \
  -I"$root/include" -L"$lib" -lvrange -Wl,-rpath,"$lib"
TIMEFORMAT='%U %S'
for i in $(seq "$rounds"); do
  if [ $((i % 2)) = 1 ]; then order="default vrange"; else order="vrange default"; fi
  for m in $order; do
    rm -f "$work"/db*
    sync
    pre=
    [ "$m" = vrange ] && pre=$work/preload.so
    out=$( { time LD_PRELOAD=$pre "$work/speedtest1" --verify --cachesize 20000 --size "$size" "$@" \
      "$work/db" 2>&1; } 2>&1)
    wall=$(awk '/TOTAL/ {gsub("s", "", $2); print $2}' <<< "$out")
    cpu=$(tail -1 <<< "$out" | awk '{print $1 + $2}')
    hash=$(awk '/Verification Hash/ {print $4}' <<< "$out")
    echo "$m $i wall=$wall cpu=$cpu hash=$hash"
  done
done | tee "$work/runs"
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
for what in wall cpu; do
  d=$(awk -v k=$what '$1=="default" {for(i=3;i<=NF;i++) if (index($i,k"=")==1) print substr($i,length(k)+2)}' "$work/runs" | median)
  v=$(awk -v k=$what '$1=="vrange" {for(i=3;i<=NF;i++) if (index($i,k"=")==1) print substr($i,length(k)+2)}' "$work/runs" | median)
  echo "$what median ($rounds runs each): default $d s, vrange $v s, ratio $(awk -v a="$v" -v b="$d" 'BEGIN {printf "%.3f", a/b}')"
done
if grep -q 'hash=$' "$work/runs"; then
  echo "a run printed no verification hash" >&2; exit 1
fi
hashes=$(awk '{print $5}' "$work/runs" | sort -u | wc -l)
[ "$hashes" = 1 ] && echo "verification hash: identical in every run" || { echo "verification hashes differ" >&2; exit 1; }
