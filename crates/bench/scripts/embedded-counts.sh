#!/usr/bin/env bash
# Instructions and cache misses per embedded decision, sluice against governor, counted by
# valgrind's cachegrind: numbers that do not move with the machine's load (criterion's times
# do). Each row runs the criterion bench binary's bounded loop (SLUICE_BENCH_LOOP) twice, with
# 0 and N decisions after the same priming, and prints the difference divided by N.
# The simulated last level is one core's L2 (512 KiB), so `L2 misses` are the decisions'
# trips past it.
#
#   crates/bench/scripts/embedded-counts.sh <bench binary> [rows...]
set -euo pipefail
bin="$1"; shift
rows=("$@")
[[ ${#rows[@]} -eq 0 ]] && rows=(hot/allowed hot/denied keys100k/allowed keys100k/denied)
impls="${IMPLS:-governor_gcra sluice_gcra sluice_tb sluice_gcra_vec}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
count() { # row impl n -> "Ir D1mr DLmr"
  SLUICE_BENCH_LOOP="$1/$2:$3" valgrind --tool=cachegrind --cache-sim=yes \
    --D1=65536,8,64 --LL=524288,8,64 --cachegrind-out-file="$tmp/out" "$bin" >/dev/null 2>&1
  # summary: Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw
  awk '/^summary:/ {print $2, $6 + $9, $7 + $10}' "$tmp/out"
}
printf '%-28s %-16s %8s %8s %8s\n' row impl instr D1miss L2miss
for row in "${rows[@]}"; do
  n=200000; [[ $row == keys100k/* ]] && n=100000
  for impl in $impls; do
    read -r i0 d0 l0 < <(count "$row" "$impl" 0)
    read -r i1 d1 l1 < <(count "$row" "$impl" "$n")
    awk -v r="$row" -v m="$impl" -v n="$n" -v i0="$i0" -v i1="$i1" -v d0="$d0" -v d1="$d1" \
      -v l0="$l0" -v l1="$l1" \
      'BEGIN { printf "%-28s %-16s %8.1f %8.2f %8.2f\n", r, m, (i1-i0)/n, (d1-d0)/n, (l1-l0)/n }'
  done
done
