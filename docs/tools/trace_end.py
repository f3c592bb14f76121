#!/usr/bin/env python3
"""Where a job's end goes, from a dualpath timeline (Chrome trace-event JSON
from `dualpath run|sim --trace FILE`): per mode, the prefill GPUs' steps (how
many, compute time, the idle time between steps), when each node's last
storage read ends, and the requests whose decode ends last, each with its
placement, the end of its storage reads, its prefill compute and its decode.

usage: trace_end.py TRACE.json [--last N]
  --last  how many of the last-finishing requests to list (default 5)

A step is the set of compute spans of one prefill GPU that start at the same
time at layer 0; its compute is the sum of its layers' spans, and the idle
time between steps is the time from one step's last layer's end to the next
step's first layer's start (docs/tuning.md, "The main job").
"""
import argparse
import collections
import json


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--last", type=int, default=5)
    a = ap.parse_args()
    events = json.load(open(a.trace))["traceEvents"]
    process = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            process[e["pid"]] = e["args"]["name"]
    modes = collections.defaultdict(lambda: {
        "layers": collections.defaultdict(list), "reads": {},
        "req": collections.defaultdict(dict)})
    for e in events:
        if e.get("ph") != "X":
            continue
        mode, _, node = process[e["pid"]].partition(" ")
        m = modes[mode]
        args = e.get("args", {})
        rid = args.get("request")
        t0 = e["ts"] / 1e6
        t1 = (e["ts"] + e["dur"]) / 1e6
        name = e["name"]
        if name == "compute" and node.startswith("pe"):
            m["layers"][(node, e["tid"], args.get("layer"))].append((t0, t1))
            r = m["req"][rid]
            r["compute"] = (min(r.get("compute", (t0, t1))[0], t0),
                            max(r.get("compute", (t0, t1))[1], t1))
        elif name == "storage read":
            m["reads"][node] = max(m["reads"].get(node, 0), t1)
            r = m["req"][rid]
            r["read_end"] = max(r.get("read_end", 0), t1)
        elif name == "prefill":
            m["req"][rid]["placed"] = t0
        elif name == "decode":
            m["req"][rid]["decode"] = (t0, t1)
    for mode, m in modes.items():
        # Steps per GPU track: distinct start times of layer 0, then the
        # layers that follow until the next layer 0.
        spans = collections.defaultdict(set)
        for (node, tid, layer), xs in m["layers"].items():
            for x in xs:
                spans[(node, tid)].add((x[0], x[1], layer))
        gpus = collections.defaultdict(set)
        for (node, tid), xs in spans.items():
            gpus[node] |= xs
        print(f"{mode}:")
        for node, xs in sorted(gpus.items()):
            xs = sorted(xs)
            steps = []
            for t0, t1, layer in xs:
                if layer == 0 or not steps:
                    steps.append([t0, t1, 0.0])
                steps[-1][1] = max(steps[-1][1], t1)
                steps[-1][2] += t1 - t0
            busy = sum(s[2] for s in steps)
            gaps = [max(b[0] - a[1], 0.0) for a, b in zip(steps, steps[1:])]
            print(f"  {node} prefill: {len(steps)} steps, compute {busy:.3f} s,"
                  f" first layer at {steps[0][0]:.3f} s, last ends"
                  f" {steps[-1][1]:.3f} s; idle between steps"
                  f" {sum(gaps):.3f} s (largest {max(gaps, default=0):.3f} s)")
        for node, t in sorted(m["reads"].items()):
            print(f"  {node} last storage read ends {t:.3f} s")
        done = [(r["decode"][1], rid, r) for rid, r in m["req"].items()
                if "decode" in r]
        done.sort()
        print("  last to finish: request, placed, reads end, prefill compute,"
              " decode (s)")
        for end, rid, r in done[-a.last:]:
            c = r.get("compute", (0, 0))
            d = r["decode"]
            read = r.get("read_end")
            read_text = f"{read:.3f}" if read is not None else "-"
            print(f"    {rid:5} {r.get('placed', 0):7.3f} {read_text:>7}"
                  f" {c[0]:7.3f}-{c[1]:.3f} {d[0]:7.3f}-{d[1]:.3f}"
                  f" ({d[1] - d[0]:.3f})")


if __name__ == "__main__":
    main()
