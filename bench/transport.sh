#!/usr/bin/env bash
# bench/run transport [--runs N] [--seconds S]: bulk transport throughput.
#   - the tcp backend between two processes on loopback at 64 KiB, 1 MiB and
#     4 MiB writes (bench_transport), against the peers at the same sizes:
#     iperf3 (one stream, -l SIZE) and ucx_perftest over TCP (ucp_put_bw and
#     ucp_am_bw); every tool gets the same number of runs, median taken.
#   - the local backend at 64 MiB against a single-thread memcpy.
# Last line:
#   RESULT transport ratio_vs_best_peer=X local_vs_memcpy=Y
# X = min over {1 MiB, 4 MiB} of (tcp backend median / best peer median);
# target X >= 1.0, Y >= 0.9. Rates in GB/s (1e9 bytes/s).
# BUILD_DIR (set by bench/run) holds an optimised build.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$root/build-bench}
runs=3
seconds=2
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    *) echo "bench transport: unknown option $1" >&2; exit 2 ;;
  esac
done
# BENCH_TRANSPORT_BIN: use an already built bench_transport instead.
bin=${BENCH_TRANSPORT_BIN:-}
if [ -z "$bin" ]; then
  cmake --build "$BUILD_DIR" --target bench_transport >&2
  bin=$(find "$BUILD_DIR" -name bench_transport -type f -perm -u+x | head -1)
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT

echo "# tcp backend, two processes on loopback; runs=$runs seconds=$seconds"
"$bin" --runs "$runs" --seconds "$seconds" | tee "$out"

median() { sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
spread() { sort -g | awk 'NR==1{lo=$1} {hi=$1} END {printf "%s..%s", lo, hi}'; }

port=15201
iperf_gbps() { # size -> GB/s of one run
  # iperf3 3.12 refuses blocks above 1 MiB (-l): larger sizes use 1 MiB
  # blocks, which is the same byte stream to TCP.
  local size=$1 p=$((port++))
  [ "$size" -gt 1048576 ] && size=1048576
  iperf3 -s -1 -p "$p" >/dev/null 2>&1 &
  local srv=$!
  sleep 0.3
  { iperf3 -c 127.0.0.1 -p "$p" -t "$seconds" -l "$size" -J 2>/dev/null |
    python3 -c 'import json,sys; print("%.4f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e9))' 2>/dev/null; } || true
  kill "$srv" 2>/dev/null || true
  wait "$srv" 2>/dev/null || true
}

ucx_gbps() { # test size -> GB/s of one run (ucx_perftest reports MiB/s)
  local test=$1 size=$2 p=$((port++))
  # About `seconds` at 0.5 GB/s; ucx_perftest's default 10,000 warm-up
  # iterations would dominate, so warm up with a tenth of the run.
  local iters=$(( (seconds * 500000000) / size ))
  [ "$iters" -gt 10000 ] && iters=10000
  [ "$iters" -lt 50 ] && iters=50
  local warm=$(( iters / 10 ))
  UCX_TLS=tcp timeout 120 ucx_perftest -p "$p" >/dev/null 2>&1 &
  local srv=$!
  sleep 0.5
  UCX_TLS=tcp timeout 120 ucx_perftest 127.0.0.1 -p "$p" -t "$test" -s "$size" -n "$iters" -w "$warm" 2>/dev/null |
    awk '/^Final:/ {printf "%.4f\n", $7 * 1048576 / 1e9}' || true
  kill "$srv" 2>/dev/null || true
  wait "$srv" 2>/dev/null || true
}

declare -A ours best bestname
for pair in "64k 65536" "1m 1048576" "4m 4194304"; do
  set -- $pair
  name=$1 size=$2
  ours[$name]=$(awk -v n="tcp_$name" '$1==n {sub("median_gbps=","",$3); print $3}' "$out")
  best[$name]=0
  bestname[$name]=none
  for tool in iperf3 ucp_put_bw ucp_am_bw; do
    vals=()
    for ((r = 0; r < runs; r++)); do
      if [ "$tool" = iperf3 ]; then v=$(iperf_gbps "$size"); else v=$(ucx_gbps "$tool" "$size"); fi
      [ -n "$v" ] && vals+=("$v")
    done
    if [ ${#vals[@]} -eq 0 ]; then
      echo "peer $tool size=$size no result"
      continue
    fi
    m=$(printf '%s\n' "${vals[@]}" | median)
    s=$(printf '%s\n' "${vals[@]}" | spread)
    echo "peer $tool size=$size median_gbps=$m spread_gbps=$s"
    if awk -v a="$m" -v b="${best[$name]}" 'BEGIN{exit !(a>b)}'; then
      best[$name]=$m
      bestname[$name]=$tool
    fi
  done
  echo "size=$size tcp_backend=${ours[$name]} best_peer=${bestname[$name]}:${best[$name]}"
done

r1=$(awk -v a="${ours[1m]}" -v b="${best[1m]}" 'BEGIN{printf "%.3f", (b>0)?a/b:0}')
r4=$(awk -v a="${ours[4m]}" -v b="${best[4m]}" 'BEGIN{printf "%.3f", (b>0)?a/b:0}')
ratio=$(awk -v a="$r1" -v b="$r4" 'BEGIN{print (a<b)?a:b}')
local_ratio=$(awk '$1=="local_64m" {for(i=1;i<=NF;i++) if ($i ~ /^ratio=/) {sub("ratio=","",$i); print $i}}' "$out")
echo "ratio_1m=$r1 ratio_4m=$r4"
echo "RESULT transport ratio_vs_best_peer=$ratio local_vs_memcpy=$local_ratio"
