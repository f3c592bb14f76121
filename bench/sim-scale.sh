#!/usr/bin/env bash
# bench/run sim-scale: the paper's scale experiment (brief section 4: offline
# JCT at 2P4D with 2K agents 3,167 s vs 48P96D with 48K agents 3,201 s, near
# constant; scheduler under 10 CPU cores) with `dualpath sim`: the actors of
# `dualpath run` in simulated time, modeled data plane.
#
# Both clusters get the same number of agents per prefill node
# (SIM_AGENTS_PER_PE, default 256; the paper has 1,000) and replay SIM_TURNS
# turns per agent (default 2) of the trace-64k workload with DeepSeek-V3.2
# 660B, mode dualpath. Scheduler cost = CPU seconds spent in the scheduler
# actor's message handlers (thread CPU clock around each of its jobs, see
# actors/sim/driver.hpp) per simulated second of the 48P96D run.
# Extra arguments go to both `dualpath sim` runs.
#
# Last line: RESULT sim-scale jct_ratio_48p96d_over_2p4d=X scheduler_cores=Y
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/sim.bash" sim-scale
per_pe=${SIM_AGENTS_PER_PE:-256}
turns=${SIM_TURNS:-2}

sim() { # name P D
  local name=$1 p=$2 d=$3
  local agents=$((p * per_pe))
  echo "== $name: ${p}P${d}D, $agents agents, $turns turns each" >&2
  /usr/bin/time -f "$name: %e s wall, %M KiB max RSS" \
    "$bin" sim --quiet --mode dualpath --prefill-nodes "$p" \
    --decode-nodes "$d" --agents "$agents" --turns "$turns" \
    --json "$out/$name.json" "${@:4}" >&2
  jq -r --arg n "$name" '.modes.dualpath as $m |
    "\($n): JCT \($m.jct_s) s (half the agents done \($m.agents_done_p50_s) s, 90% \($m.agents_done_p90_s) s), TTFT p50 \($m.ttft_p50_s) s, TPOT p50 \($m.tpot_p50_s) s, SNIC Max/Avg \($m.snic_max_over_avg), events \($m.sim.events) (\($m.sim.events_per_s | floor)/s), scheduler \($m.sim.scheduler_cpu_s) CPU s = \($m.sim.scheduler_cores) cores"' \
    "$out/$name.json" >&2
}

sim 2p4d 2 4 "$@"
sim 48p96d 48 96 "$@"
jct_small=$(jq '.modes.dualpath.jct_s' "$out/2p4d.json")
jct_large=$(jq '.modes.dualpath.jct_s' "$out/48p96d.json")
cores=$(jq '.modes.dualpath.sim.scheduler_cores' "$out/48p96d.json")
ratio=$(python3 -c "print(f'{$jct_large / $jct_small:.4f}')")
for q in p50 p90; do
  small=$(jq ".modes.dualpath.agents_done_${q}_s" "$out/2p4d.json")
  large=$(jq ".modes.dualpath.agents_done_${q}_s" "$out/48p96d.json")
  echo "agents done ${q}: 48P96D / 2P4D = $(python3 -c "print(f'{$large / $small:.4f}')")" >&2
done
cores=$(python3 -c "print(f'{$cores:.4f}')")
echo "RESULT sim-scale jct_ratio_48p96d_over_2p4d=$ratio scheduler_cores=$cores"
