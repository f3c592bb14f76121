#!/usr/bin/env bash
# bench/run sim-pd-sweep: DS-27B offline JCT at 1P1D, 2P1D and 1P2D, Basic vs
# DualPath, in simulated time (`dualpath sim`). Paper (brief section 4): mean
# 1.64x, up to 2.46x; equal total storage bandwidth gives equal performance
# (2P1D and 1P2D both have 3 storage NICs).
# SIM_AGENTS agents (default 1024) replay SIM_TURNS turns each (default 0: whole
# trajectories, every turn from the first).
# Last line: RESULT sim-pd-sweep speedup_1p1d=X speedup_2p1d=Y speedup_1p2d=Z
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/sim.bash" sim-pd-sweep
agents=${SIM_AGENTS:-1024}
turns=${SIM_TURNS:-0}
result="RESULT sim-pd-sweep"
printf '%-6s %12s %12s %8s %10s\n' P/D basic_jct_s dual_jct_s speedup snic_pe_de >&2
for pd in "1 1" "2 1" "1 2"; do
  set -- $pd
  name="${1}p${2}d"
  "$bin" sim --quiet --model ds-27b --mode basic,dualpath --prefill-nodes "$1" \
    --decode-nodes "$2" --agents "$agents" --turns "$turns" \
    --json "$out/$name.json" >&2
  read -r b d s u <<<"$(jq -r '[.modes.basic.jct_s, .modes.dualpath.jct_s,
      .ratios.basic_over_dualpath_jct,
      "\(.modes.dualpath.snic_util_pe*100|floor)%/\(.modes.dualpath.snic_util_de*100|floor)%"]
      | @tsv' "$out/$name.json")"
  printf '%-6s %12.1f %12.1f %8.2f %10s\n' "$name" "$b" "$d" "$s" "$u" >&2
  result+=" speedup_$name=$(printf '%.3f' "$s")"
done
echo "$result"
