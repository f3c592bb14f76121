#!/usr/bin/env bash
# bench/run sim-plan: P/D ratios inside and outside the bottleneck-free range of
# `dualpath plan` (1/7 <= P/D <= 7/2 on paper-hopper), simulated (`dualpath
# sim`, DS-660B, DualPath, offline, SIM_AGENTS_PER_PE agents per prefill node,
# default 1024, SIM_TURNS turns, default 0: whole trajectories). The shapes
# keep at least two nodes per role: DS-660B's weights (671 GB) do not fit one
# node's 8 x 80 GB of HBM with the activation reserve, so 1P* or *1D shapes
# are refused (exit 2); P/D 1/8, 1/2, 1 and 2 are 2P16D, 2P4D, 2P2D and 4P2D
# (4P2D alone takes ~2 CPU minutes: decode HBM, not a link, limits it, see
# docs/simulation.md). For each P/D: the planner's verdict
# (links over capacity at saturation) and the simulation's busiest link class
# (utilisation = nominal bytes / (rate x JCT), max over the links of a class).
# Last line: RESULT sim-plan busiest_<pd>=<link class> ...
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/sim.bash" sim-plan
per_pe=${SIM_AGENTS_PER_PE:-1024}
turns=${SIM_TURNS:-0}
result="RESULT sim-plan"
for pd in "2 16" "2 4" "2 2" "4 2"; do
  set -- $pd
  name="${1}p${2}d"
  verdict=$("$bin" plan --prefill-nodes "$1" --decode-nodes "$2" 2>&1 |
    awk '/bottleneck-free/ {v=$0} /OVER CAPACITY/ {o=o" "$1} END {print v" |"o}' || true)
  "$bin" sim --quiet --mode dualpath --prefill-nodes "$1" --decode-nodes "$2" \
    --agents $(($1 * per_pe)) --turns "$turns" --set run.wall_limit_s=7200 \
    --json "$out/$name.json" >&2
  busiest=$(jq -r '.modes.dualpath.sim.links | to_entries | max_by(.value.max_util) | .key' "$out/$name.json")
  echo "== $name: plan: $verdict" >&2
  jq -r '.modes.dualpath as $m | "   sim: JCT \($m.jct_s|.*10|round/10) s, tokens/s per GPU \($m.tokens_per_s|floor)/'"$((8 * ($1 + $2)))"', TTFT p50 \($m.ttft_p50_s) s; link max util: " + ([$m.sim.links | to_entries[] | "\(.key) \(.value.max_util*100|round)%"] | join(", "))' "$out/$name.json" >&2
  result+=" busiest_$name=$busiest"
done
echo "$result"
