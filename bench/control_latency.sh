#!/usr/bin/env bash
# bench/run control_latency [--runs N] [--light AxT] [--heavy AxT]
#     [--byte-scale N] [--time-scale X]: control traffic isolated from KV
# traffic end to end. A deployment on 127.0.0.1 (scheduler, one prefill and
# one decode node, `dualpath node`, tcp bulk transport, as the single-host
# recipe of docs/deployment.md) is driven N times (default 5) by
# `dualpath run --cluster` with a light job (A agents x T turns, default
# 1x16: one request at a time, no other KV in flight) and then a heavy one
# (default 16x2: the KV of 16 agents at once over the same processes, byte
# scale 4 = a quarter of the nominal bytes read, moved and verified for
# real, time scale 20), which keeps the nodes' CPUs busy (the script prints
# the nodes' CPU cores used during each job). Each job reports
# control_rtt_p99_ms: the round trip of the prefill engine's fetch to the
# scheduler that placed each request (docs/observability.md). Last line:
#   RESULT control_latency runs=N p99_ratio=X ratio_spread=A..B
#     light_p99_ms=.. heavy_p99_ms=.. heavy_kv_gb_per_s=..
#   (X: median over the runs of heavy/light p99; the isolation target of
#    issue 22 is <= 1.2)
# DUALPATH_BIN: an already built dualpath instead of $BUILD_DIR/bin/dualpath.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$root/build-bench}
bin=${DUALPATH_BIN:-}
if [ -z "$bin" ]; then
  cmake --build "$BUILD_DIR" --target dualpath >&2
  bin=$BUILD_DIR/bin/dualpath
fi
runs=5
light=1x16
heavy=16x2
byte_scale=4
time_scale=20
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --light) light=$2; shift 2 ;;
    --heavy) heavy=$2; shift 2 ;;
    --byte-scale) byte_scale=$2; shift 2 ;;
    --time-scale) time_scale=$2; shift 2 ;;
    *) echo "bench control_latency: unknown option '$1' (--runs, --light," \
            "--heavy, --byte-scale, --time-scale)" >&2; exit 2 ;;
  esac
done
for job in "$light" "$heavy"; do
  if ! [[ $job =~ ^[0-9]+x[0-9]+$ ]]; then
    echo "bench control_latency: '$job' is not AGENTSxTURNS (e.g. 16x2)" >&2
    exit 2
  fi
done

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# Three ports that were free a moment ago.
read -r caf_port pe_port de_port < <(/usr/bin/python3 -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])')
cat > "$work/cluster.toml" <<EOF
[cluster]
scheduler = "sched"
storage = "$work/store"
bulk_secret = "bench-control-latency-0123456789"

[tls]
mode = "plaintext"

[[node]]
name = "sched"
role = "scheduler"
host = "127.0.0.1"
port = $caf_port

EOF
for node in "pe0 prefill $pe_port" "de0 decode $de_port"; do
  read -r name role port <<< "$node"
  printf '\n[[node]]\nname = "%s"\nrole = "%s"\nhost = "127.0.0.1"\n%s\n%s\n' \
    "$name" "$role" "bulk_port = $port" "gpus = [0, 1]" >> "$work/cluster.toml"
done
# The profiles named: the nodes and the driver must run the same cluster
# (not `dualpath run`'s main job, whose defaults only run has).
settings=(--set hardware.profile=paper-hopper --set model.profile=ds-660b
          --set hardware.gpus_per_node=2 --set model.total_params=37e9
          --set run.byte_scale="$byte_scale" --set run.time_scale="$time_scale"
          --set run.modes=dualpath --set run.prefill_nodes=1
          --set run.decode_nodes=1 --set transport.backend=tcp)
echo "# bench control_latency: load: $(cut -d' ' -f1-3 /proc/loadavg);" \
     "light $light, heavy $heavy, byte scale $byte_scale, time scale" \
     "$time_scale, $runs runs"
for n in sched pe0 de0; do
  "$bin" node --cluster "$work/cluster.toml" --name "$n" "${settings[@]}" \
    > "$work/$n.out" 2> "$work/$n.log" &
  pids+=($!)
done
for n in pe0 de0; do
  for _ in $(seq 600); do
    grep -q joined "$work/$n.log" && break
    sleep 0.1
  done
  grep -q joined "$work/$n.log" || {
    echo "bench control_latency: node $n did not join:" >&2
    cat "$work"/*.log >&2
    exit 1
  }
done

# CPU ticks the node processes used so far.
node_ticks() {
  local sum=0 p
  for p in "${pids[@]}"; do
    sum=$((sum + $(awk '{print $14 + $15}' "/proc/$p/stat")))
  done
  echo "$sum"
}

# drive JOB SEED: one job against the deployment; prints
# "p99_ms requests kv_real_bytes_per_s node_cores".
drive() {
  local agents=${1%x*} turns=${1#*x}
  local t0 w0
  t0=$(node_ticks)
  w0=$(date +%s.%N)
  "$bin" run --cluster "$work/cluster.toml" "${settings[@]}" --quiet --json \
    --set workload.agents="$agents" --set run.turns="$turns" \
    --set workload.seed="$2" > "$work/job.json" 2> "$work/job.err" || {
    echo "bench control_latency: job $1 failed:" >&2
    cat "$work/job.err" "$work"/*.log >&2
    exit 1
  }
  local cores
  cores=$(/usr/bin/python3 -c "print(round(($(node_ticks) - $t0) / \
    $(getconf CLK_TCK) / ($(date +%s.%N) - $w0), 2))")
  /usr/bin/python3 - "$work/job.json" "$byte_scale" "$cores" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
m = doc["modes"]["dualpath"]
if m["failed_requests"] or m["verify_failures"]:
    sys.exit("failed requests or verify failures: %s" % m)
real = m["bytes_compute_net"] / float(sys.argv[2])
print(m["control_rtt_p99_ms"], m["requests"], real / m["wall_s"], sys.argv[3])
EOF
}

ratios=()
lights=()
heavies=()
rates=()
for r in $(seq "$runs"); do
  read -r lp ln _ lcores < <(drive "$light" "$((2 * r))")
  read -r hp hn hrate hcores < <(drive "$heavy" "$((2 * r + 1))")
  ratio=$(/usr/bin/python3 -c "print(round($hp / $lp, 3))")
  echo "run $r: light p99 $lp ms ($ln requests, nodes on $lcores cores)," \
       "heavy p99 $hp ms ($hn requests, nodes on $hcores cores, KV" \
       "$(/usr/bin/python3 -c "print(round($hrate / 1e9, 2))") GB/s real" \
       "over the bulk transport), ratio $ratio"
  ratios+=("$ratio")
  lights+=("$lp")
  heavies+=("$hp")
  rates+=("$hrate")
done
/usr/bin/python3 - "${ratios[*]}" "${lights[*]}" "${heavies[*]}" \
  "${rates[*]}" "$runs" <<'EOF'
import statistics as st, sys
ratios, lights, heavies, rates = ([float(x) for x in a.split()]
                                  for a in sys.argv[1:5])
print("RESULT control_latency runs=%s p99_ratio=%.3f ratio_spread=%.3f..%.3f "
      "light_p99_ms=%.3f heavy_p99_ms=%.3f heavy_kv_gb_per_s=%.2f"
      % (sys.argv[5], st.median(ratios), min(ratios), max(ratios),
         st.median(lights), st.median(heavies), st.median(rates) / 1e9))
EOF
