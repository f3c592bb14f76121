#!/usr/bin/env bash
# bench/run sim-append: longer appends (1x, 2x, 3x the trace's 429 tokens per
# turn), DS-660B 2P4D offline, Basic vs DualPath vs Oracle, in simulated time.
# Paper (brief section 4): DualPath 1.82-1.99x faster than Basic; at 3x Basic
# approaches Oracle (compute-bound again).
# SIM_AGENTS agents (default 2048: 1,024 per prefill node, as in the paper) replay SIM_TURNS turns each (default 0: whole trajectories).
# Last line: RESULT sim-append speedup_1x=A speedup_2x=B speedup_3x=C
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/sim.bash" sim-append
agents=${SIM_AGENTS:-2048}
turns=${SIM_TURNS:-0}
result="RESULT sim-append"
printf '%-4s %12s %12s %12s %14s %16s\n' x basic_jct_s dual_jct_s oracle_jct_s basic/dualpath basic/oracle >&2
for x in 1 2 3; do
  "$bin" sim --quiet --mode all --agents "$agents" --turns "$turns" \
    --set "workload.append_tokens=$((429 * x))" --json "$out/$x.json" >&2
  read -r b d o s <<<"$(jq -r '[.modes.basic.jct_s, .modes.dualpath.jct_s,
      .modes.oracle.jct_s, .ratios.basic_over_dualpath_jct] | @tsv' "$out/$x.json")"
  printf '%-4s %12.1f %12.1f %12.1f %14.2f %16.2f\n' "${x}x" "$b" "$d" "$o" "$s" \
    "$(python3 -c "print($b / $o)")" >&2
  result+=" speedup_${x}x=$(printf '%.3f' "$s")"
done
echo "$result"
