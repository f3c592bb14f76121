#!/usr/bin/env bash
# bench/run transport [--runs N] [--seconds S]: bulk transport throughput.
# Each of N rounds (default 5) runs, each size's contenders back to back
# (in reverse order in odd rounds) so that they share the machine's state:
#   - bench_transport once: the tcp backend between two processes on loopback
#     at 64 KiB, 1 MiB and 4 MiB kv writes, with the peers' working set (every
#     write from and to the same bytes, `_hot`) and with writes cycling through
#     64 MiB regions; a plain send/recv loop with the cycling working set
#     (`raw_`); the local backend at 64 MiB against a single-thread memcpy;
#   - the peers at 1 MiB and 4 MiB: iperf3 (one stream, -l SIZE; iperf3 3.12
#     refuses blocks above 1 MiB, so 4 MiB uses 1 MiB blocks, the same byte
#     stream to TCP) and ucx_perftest over TCP (ucp_put_bw, ucp_am_bw).
# A round's ratio is min over {1 MiB, 4 MiB} of tcp_<size>_hot / best peer of
# that round; the result is the median over rounds, with min..max.
# Last line:
#   RESULT transport runs=N ratio_vs_best_peer=X ratio_spread=A..B
#     local_vs_memcpy=Y local_spread=C..D cold_vs_raw=Z cold_vs_best_peer=W
# (one line). Targets: X >= 1.0, Y >= 0.95. cold_vs_raw: min over sizes of
# tcp_<size> / raw_<size> (the backend against a bare loop with the same
# memory); cold_vs_best_peer: tcp_<size> / best peer. GB/s = 1e9 bytes/s.
# BUILD_DIR (set by bench/run) holds an optimised build; BENCH_TRANSPORT_BIN
# uses an already built bench_transport instead.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$root/build-bench}
runs=5
seconds=2
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    *) echo "bench transport: unknown option $1" >&2; exit 2 ;;
  esac
done
bin=${BENCH_TRANSPORT_BIN:-}
if [ -z "$bin" ]; then
  cmake --build "$BUILD_DIR" --target bench_transport >&2
  bin=$(find "$BUILD_DIR" -name bench_transport -type f -perm -u+x | head -1)
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT

port=$((15200 + RANDOM % 2000))
iperf_gbps() { # size -> GB/s of one run
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
  # About `seconds` at 5 GB/s (it reached 10 GB/s at 1 MiB on a quiet
  # 2-core VM, so fewer iterations would end in a fraction of a second);
  # ucx_perftest's default 10,000 warm-up iterations would dominate, so
  # warm up with a tenth of the run.
  local iters=$(( (seconds * 5000000000) / size ))
  [ "$iters" -gt 40000 ] && iters=40000
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

ours() { # round workload: one run of one bench_transport workload
  "$bin" --runs 1 --seconds "$seconds" --only "$2" | sed "s/^/round=$1 /" | tee -a "$log"
}
peer() { # round tool size
  local v
  if [ "$2" = iperf3 ]; then v=$(iperf_gbps "$3"); else v=$(ucx_gbps "$2" "$3"); fi
  echo "round=$1 peer=$2 size=$3 gbps=${v:-none}" | tee -a "$log"
}

echo "# bench transport: runs=$runs seconds=$seconds load: $(cut -d' ' -f1-3 /proc/loadavg)"
for ((r = 0; r < runs; r++)); do
  # Each size's contenders run back to back, in the opposite order in odd
  # rounds, so a change of the machine's load during a round does not
  # favour one side.
  for size in 1048576 4194304; do
    n=$([ "$size" = 1048576 ] && echo 1m || echo 4m)
    order=("tcp_${n}_hot" iperf3 ucp_am_bw "tcp_$n" "raw_$n" ucp_put_bw)
    if ((r % 2)); then
      order=(ucp_put_bw "raw_$n" "tcp_$n" ucp_am_bw iperf3 "tcp_${n}_hot")
    fi
    for x in "${order[@]}"; do
      case $x in
        tcp_* | raw_*) ours "$r" "$x" ;;
        *) peer "$r" "$x" "$size" ;;
      esac
    done
  done
  ours "$r" tcp_64k
  ours "$r" local_64m
done

python3 - "$log" "$runs" <<'EOF'
import re, sys
log, runs = sys.argv[1], int(sys.argv[2])
ours, peers, local = {}, {}, {}
for line in open(log):
    m = re.match(r"round=(\d+) (\S+) size=(\d+) median_gbps=([0-9.]+)", line)
    if m:
        r, name = int(m.group(1)), m.group(2)
        ours[(r, name)] = float(m.group(4))
        l = re.search(r" ratio=([0-9.]+)", line)
        if name == "local_64m" and l:
            local[r] = float(l.group(1))
        continue
    m = re.match(r"round=(\d+) peer=(\S+) size=(\d+) gbps=([0-9.]+)", line)
    if m:
        key = (int(m.group(1)), int(m.group(3)))
        peers.setdefault(key, []).append((float(m.group(4)), m.group(2)))

def med(xs):
    xs = sorted(xs)
    n = len(xs)
    return 0.0 if n == 0 else (xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2)

def spread(xs):
    return "%.3f..%.3f" % (min(xs), max(xs)) if xs else "none"

names = {1048576: "1m", 4194304: "4m"}
hot, cold_raw, cold_peer = [], [], []
for r in range(runs):
    hr, cr, cp = [], [], []
    for size, n in names.items():
        best = max(peers.get((r, size), [(0.0, "none")]))
        h = ours.get((r, "tcp_%s_hot" % n), 0.0)
        c = ours.get((r, "tcp_%s" % n), 0.0)
        w = ours.get((r, "raw_%s" % n), 0.0)
        hr.append(h / best[0] if best[0] > 0 else 0.0)
        cp.append(c / best[0] if best[0] > 0 else 0.0)
        cr.append(c / w if w > 0 else 0.0)
        print("round=%d size=%d tcp_hot=%.3f tcp_cycling=%.3f raw=%.3f best_peer=%s:%.3f"
              % (r, size, h, c, w, best[1], best[0]))
    hot.append(min(hr)); cold_raw.append(min(cr)); cold_peer.append(min(cp))
for size, n in names.items():
    for name in ("tcp_%s_hot" % n, "tcp_%s" % n, "raw_%s" % n):
        xs = [ours[(r, name)] for r in range(runs) if (r, name) in ours]
        print("%s median_gbps=%.3f spread_gbps=%s" % (name, med(xs), spread(xs)))
    for tool in ("iperf3", "ucp_put_bw", "ucp_am_bw"):
        xs = [v for r in range(runs) for v, t in peers.get((r, size), []) if t == tool]
        print("peer %s size=%d median_gbps=%.3f spread_gbps=%s" % (tool, size, med(xs), spread(xs)))
lr = [local[r] for r in range(runs) if r in local]
print("RESULT transport runs=%d ratio_vs_best_peer=%.3f ratio_spread=%s "
      "local_vs_memcpy=%.3f local_spread=%s cold_vs_raw=%.3f cold_vs_best_peer=%.3f"
      % (runs, med(hot), spread(hot), med(lr), spread(lr), med(cold_raw), med(cold_peer)))
EOF
