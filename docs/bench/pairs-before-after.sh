#!/usr/bin/env bash
# vrange-malloc before (the allocator as of the previous release, without its per-CPU cache)
# and after, interleaved, median of 5 runs of 0.3 s per cell: ns of CPU per malloc+free pair.
set -eu
pair=$1 before=$2 after=$3
med() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
printf '| size | threads | glibc | before | after | after / before |\n|---|---|---|---|---|---|\n'
for size in 64K 512K 2M; do
  for t in 1 2 16; do
    g=(); b=(); a=()
    for i in 1 2 3 4 5; do
      g+=("$("$pair" -t $t -s $size -S 0.3 | sed 's/ns_per_pair=\([0-9.]*\).*/\1/')")
      b+=("$(LD_PRELOAD=$before "$pair" -t $t -s $size -S 0.3 | sed 's/ns_per_pair=\([0-9.]*\).*/\1/')")
      a+=("$(LD_PRELOAD=$after "$pair" -t $t -s $size -S 0.3 | sed 's/ns_per_pair=\([0-9.]*\).*/\1/')")
    done
    # pair.c prints wall time summed over threads per pair; scale to CPU time as `vrange-bench pairs` does.
    scale=$(( t < $(nproc) ? t : $(nproc) ))
    G=$(printf '%s\n' "${g[@]}" | med); B=$(printf '%s\n' "${b[@]}" | med); A=$(printf '%s\n' "${a[@]}" | med)
    awk -v s=$size -v t=$t -v g=$G -v b=$B -v a=$A -v c=$scale -v n=$t 'BEGIN{f=c/n; printf "| %s | %d | %.0f ns | %.0f ns | %.0f ns | %.2f× |\n", s, t, g*f, b*f, a*f, a/b}'
  done
done
