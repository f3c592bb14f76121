#!/usr/bin/env bash
# bench/run storage: Full Block read throughput of the storage reader path
# (bench_storage, io_uring backend) against fio on the same files, block size,
# queue depth and engine (io_uring), with O_DIRECT and from the page cache.
#
# Workloads (see bench/storage.cpp): ds660b = 64 tokens x 61 layers x 656 B
# (2.5 MiB blocks, 48 files), qwen32b = 64 x 64 x 4096 B (16 MiB, 16 files);
# queue depths 1, 8, 32. Each case runs reader and fio alternately RUNS times;
# the table shows medians and [min, max]; the ratio is median reader / median
# fio. Last line: RESULT storage ratio_vs_fio=<smallest ratio over the cases>.
#
# Environment: BUILD_DIR (default build), BENCH_STORAGE_DIR (default
# $TMPDIR/dualpath-bench-storage, about 375 MiB, removed at the end unless
# BENCH_STORAGE_KEEP=1), BENCH_STORAGE_RUNS (default 5).
set -euo pipefail

BUILD_DIR=${BUILD_DIR:-build}
BIN=${BENCH_STORAGE_BIN:-$BUILD_DIR/bin/bench_storage}
DIR=${BENCH_STORAGE_DIR:-${TMPDIR:-/tmp}/dualpath-bench-storage}
RUNS=${BENCH_STORAGE_RUNS:-5}

[[ -x $BIN ]] || { echo "bench/storage.sh: $BIN not built" >&2; exit 1; }
command -v fio >/dev/null || { echo "bench/storage.sh: fio not installed" >&2; exit 1; }
command -v python3 >/dev/null || { echo "bench/storage.sh: python3 needed" >&2; exit 1; }

cleanup() { [[ ${BENCH_STORAGE_KEEP:-0} == 1 ]] || rm -rf "$DIR"; }
trap cleanup EXIT

declare -A BS FILES
while read -r name bs files; do
  BS[$name]=$bs
  FILES[$name]=$files
done < <("$BIN" prepare "$DIR")
# Let the writeback of the freshly written files finish before measuring.
sync

# Bytes per measurement: ~0.5 s at the speeds seen on the build machines.
volume() { [[ $1 == direct ]] && echo $((256 << 20)) || echo $((1024 << 20)); }

fio_gbps() { # name mode qd bytes
  local direct=0
  [[ $2 == direct ]] && direct=1
  # invalidate=0 keeps the page cache warm for the buffered cases; buffers are
  # 4 KiB-aligned like the reader's (unaligned 2.5-16 MiB buffered copies ran
  # about 8x slower in fio here, which would flatter the reader).
  fio --name=storage --filename="${FILES[$1]}" --rw=read --bs="${BS[$1]}" \
    --iodepth="$3" --ioengine=io_uring --direct=$direct --invalidate=0 \
    --iomem_align=4096 \
    --io_size="$4" --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["read"]["bw_bytes"]/1e9)'
}

reader_gbps() { # name mode qd bytes
  "$BIN" read "$DIR" "$1" "$2" "$3" "$4" | sed -n 's/.*GBps=\([0-9.]*\).*/\1/p'
}

echo "# bench/run storage: $RUNS runs per case, files in $DIR"
echo "# command: BUILD_DIR=$BUILD_DIR bench/storage.sh ($(fio --version), $(uname -r))"
results=$(mktemp)
for name in ds660b qwen32b; do
  for mode in direct buffered; do
    # Warm the page cache for the buffered cases (and touch every file once).
    [[ $mode == buffered ]] && tr ':' '\n' <<<"${FILES[$name]}" | xargs cat >/dev/null
    for qd in 1 8 32; do
      bytes=$(volume $mode)
      # One untimed warm-up of each side (ring setup, cache, device queue).
      reader_gbps $name $mode $qd $((bytes / 4)) >/dev/null
      fio_gbps $name $mode $qd $((bytes / 4)) >/dev/null
      for ((r = 0; r < RUNS; ++r)); do
        # Alternate who goes first so drift hurts neither side.
        if ((r % 2 == 0)); then
          a=$(reader_gbps $name $mode $qd $bytes); b=$(fio_gbps $name $mode $qd $bytes)
        else
          b=$(fio_gbps $name $mode $qd $bytes); a=$(reader_gbps $name $mode $qd $bytes)
        fi
        echo "$name $mode $qd $a $b" >>"$results"
      done
    done
  done
done
verify=$("$BIN" verify "$DIR" ds660b | sed 's/verify //')

python3 - "$results" "$verify" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    name, mode, qd, a, b = line.split()
    rows.setdefault((name, mode, int(qd)), ([], []))
    rows[(name, mode, int(qd))][0].append(float(a))
    rows[(name, mode, int(qd))][1].append(float(b))
print("| workload | mode | QD | reader GB/s median [min, max] | fio GB/s median [min, max] | ratio |")
print("|---|---|---|---|---|---|")
worst = None
for (name, mode, qd), (a, b) in rows.items():
    ma, mb = statistics.median(a), statistics.median(b)
    ratio = ma / mb if mb > 0 else 0.0
    worst = ratio if worst is None else min(worst, ratio)
    print(f"| {name} | {mode} | {qd} | {ma:.3f} [{min(a):.3f}, {max(a):.3f}] "
          f"| {mb:.3f} [{min(b):.3f}, {max(b):.3f}] | {ratio:.3f} |")
print(f"# layer checksum verification, one core: {sys.argv[2]}")
print(f"RESULT storage ratio_vs_fio={worst:.3f}")
PY
rm -f "$results"
