#!/usr/bin/env python3
"""Renders a dualpath timeline (Chrome trace-event JSON from `dualpath run
--trace FILE`) as a PNG with gnuplot: one row per track (node and engine or
NIC), one box per span, coloured by step.

usage: trace_png.py TRACE.json OUT.png [--process PREFIX] [--from US] [--to US]
  --process  only processes whose name starts with PREFIX (e.g. "dualpath")
  --from/--to  a time window in microseconds (emulated)
"""
import argparse
import json
import subprocess
import sys

COLOURS = {
    "prefill": "#d0d0d0", "decode": "#d0d0d0", "compute": "#1f77b4",
    "h2d": "#2ca02c", "transfer": "#ff7f0e", "send": "#9467bd",
    "storage read": "#8c564b", "generate": "#17becf", "persist": "#e377c2",
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--process", default="")
    ap.add_argument("--from", dest="t0", type=float, default=None)
    ap.add_argument("--to", dest="t1", type=float, default=None)
    a = ap.parse_args()
    events = json.load(open(a.trace))["traceEvents"]
    procs, threads = {}, {}
    for e in events:
        if e.get("ph") == "M" and e["name"] == "process_name":
            procs[e["pid"]] = e["args"]["name"]
        if e.get("ph") == "M" and e["name"] == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
    spans = [e for e in events if e.get("ph") == "X"
             and procs.get(e["pid"], "").startswith(a.process)]
    if a.t0 is not None:
        spans = [e for e in spans if e["ts"] + e["dur"] >= a.t0]
    if a.t1 is not None:
        spans = [e for e in spans if e["ts"] <= a.t1]
    if not spans:
        sys.exit("no spans to draw")
    rows = sorted({(e["pid"], e["tid"]) for e in spans})
    row_of = {r: i for i, r in enumerate(rows)}
    lo = min(e["ts"] for e in spans) if a.t0 is None else a.t0
    hi = max(e["ts"] + e["dur"] for e in spans) if a.t1 is None else a.t1
    gp = ["set terminal pngcairo size 1400,%d font ',9'" % (120 + 22 * len(rows)),
          "set output '%s'" % a.out,
          "set title 'dualpath timeline (emulated ms)'",
          "set xrange [%f:%f]" % (lo / 1000, hi / 1000),
          "set yrange [-0.5:%f]" % (len(rows) - 0.5),
          "set xlabel 'emulated time (ms)'",
          "unset key", "set grid xtics",
          "set ytics (%s)" % ", ".join(
              "'%s %s' %d" % (procs[p], threads.get((p, t), t), row_of[(p, t)])
              for p, t in rows)]
    # Outer spans first, so nested steps are drawn on top.
    for i, e in enumerate(sorted(spans, key=lambda e: -e["dur"])):
        y = row_of[(e["pid"], e["tid"])]
        h = 0.42 if e["name"] in ("prefill", "decode") else 0.32
        gp.append("set object %d rect from %f,%f to %f,%f fc rgb '%s' "
                  "fs solid 0.9 noborder" % (
                      i + 1, e["ts"] / 1000, y - h,
                      (e["ts"] + max(e["dur"], 0.001)) / 1000, y + h,
                      COLOURS.get(e["name"], "#7f7f7f")))
    # A legend: one invisible point per step.
    names = sorted({e["name"] for e in spans})
    gp.append("set key outside right top")
    gp.append("plot " + ", ".join(
        "NaN with boxes fs solid lc rgb '%s' title '%s'" % (COLOURS.get(n, "#7f7f7f"), n)
        for n in names))
    subprocess.run(["gnuplot"], input="\n".join(gp) + "\n", text=True, check=True)


if __name__ == "__main__":
    main()
