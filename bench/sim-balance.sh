#!/usr/bin/env bash
# bench/run sim-balance: storage-NIC load balance (Max/Avg of the bytes each
# storage NIC moved) with round-robin placement and the shorter-queue path
# choice (dualpath-rr) against the paper's scheduler (dualpath), DS-660B 2P4D
# offline, in simulated time. Paper (brief section 4): 1.53 -> 1.18.
# SIM_AGENTS agents (default 2048: 1,024 per prefill node, as in the paper) replay SIM_TURNS turns each (default 3).
# Last line: RESULT sim-balance max_over_avg_rr=X max_over_avg_scheduler=Y
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$root/build-bench}
agents=${SIM_AGENTS:-2048}
turns=${SIM_TURNS:-3}
cmake --build "$BUILD_DIR" --target dualpath >&2
bin=$BUILD_DIR/bin/dualpath
out=$(mktemp -d "${TMPDIR:-/tmp}/sim-balance-XXXXXX")
trap 'rm -rf "$out"' EXIT
"$bin" sim --quiet --mode dualpath-rr,dualpath --agents "$agents" \
  --turns "$turns" --json "$out/b.json" >&2
jq -r '.modes | to_entries[] | "\(.key): SNIC Max/Avg \(.value.snic_max_over_avg), JCT \(.value.jct_s) s, PE/DE util \(.value.snic_util_pe)/\(.value.snic_util_de)"' "$out/b.json" >&2
rr=$(jq '.modes["dualpath-rr"].snic_max_over_avg' "$out/b.json")
sc=$(jq '.modes.dualpath.snic_max_over_avg' "$out/b.json")
echo "RESULT sim-balance max_over_avg_rr=$(printf '%.3f' "$rr") max_over_avg_scheduler=$(printf '%.3f' "$sc")"
