#!/usr/bin/env bash
# bench/run sim-balance: storage-NIC load balance (Max/Avg of the bytes each
# storage NIC moved) with round-robin placement and the shorter-queue path
# choice (dualpath-rr) against the paper's scheduler (dualpath), DS-660B 2P4D
# offline, in simulated time. Paper (brief section 4): 1.53 -> 1.18.
# SIM_AGENTS agents (default 2048: 1,024 per prefill node, as in the paper)
# replay SIM_TURNS turns each (default 0: whole trajectories), once per workload seed in SIM_SEEDS
# (default "1 2 3": three different traces; Max/Avg moves by a few percent
# with the trace, so one seed cannot rank two policies this close).
# Last line: RESULT sim-balance max_over_avg_rr=X max_over_avg_scheduler=Y
# (means over the seeds; each seed's values and the spread are printed above).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/sim.bash" sim-balance
agents=${SIM_AGENTS:-2048}
turns=${SIM_TURNS:-0}
seeds=${SIM_SEEDS:-1 2 3}
for seed in $seeds; do
  "$bin" sim --quiet --mode dualpath-rr,dualpath --agents "$agents" \
    --turns "$turns" --set "workload.seed=$seed" --json "$out/b$seed.json" >&2
  jq -r --arg s "$seed" '.modes | to_entries[] | "seed \($s) \(.key): SNIC Max/Avg \(.value.snic_max_over_avg), JCT \(.value.jct_s) s, PE/DE util \(.value.snic_util_pe)/\(.value.snic_util_de)"' "$out/b$seed.json" >&2
done
python3 - "$out" $seeds <<'PY'
import json, sys, statistics as st
out, seeds = sys.argv[1], sys.argv[2:]
vals = {"dualpath-rr": [], "dualpath": []}
for s in seeds:
    doc = json.load(open(f"{out}/b{s}.json"))
    for m in vals:
        vals[m].append(doc["modes"][m]["snic_max_over_avg"])
for m, v in vals.items():
    print(f"{m}: Max/Avg mean {st.mean(v):.3f}, min {min(v):.3f}, max {max(v):.3f} over {len(v)} seeds", file=sys.stderr)
wins = sum(1 for a, b in zip(vals["dualpath"], vals["dualpath-rr"]) if a < b)
print(f"scheduler below round robin in {wins} of {len(seeds)} seeds", file=sys.stderr)
print(f"RESULT sim-balance max_over_avg_rr={st.mean(vals['dualpath-rr']):.3f} "
      f"max_over_avg_scheduler={st.mean(vals['dualpath']):.3f}")
PY
