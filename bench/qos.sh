#!/usr/bin/env bash
# bench/run qos [--runs N] [--samples N] [--control-cpu N] [tcp option
# flags]: p99 latency of 4 KiB control writes alone and while a kv stream
# saturates the same connection pair (tcp backend, two processes on
# loopback); N runs (default 5), each measuring alone then loaded. The
# control path runs on CPU 0 (transport.tcp_control_cpu in both processes,
# and the posting thread); --control-cpu -1 lets the kernel place it. Last
# line:
#   RESULT qos runs=N p99_ratio=X ratio_spread=A..B alone_p99_us=..
#     loaded_p99_us=.. control_cpu=C   (X: median of the runs' loaded/alone
#                         p99; target <= 1.2)
# BUILD_DIR (set by bench/run) holds an optimised build.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$root/build-bench}
# BENCH_QOS_BIN: use an already built bench_qos instead.
bin=${BENCH_QOS_BIN:-}
if [ -z "$bin" ]; then
  cmake --build "$BUILD_DIR" --target bench_qos >&2
  bin=$(find "$BUILD_DIR" -name bench_qos -type f -perm -u+x | head -1)
fi
echo "# bench qos: load: $(cut -d' ' -f1-3 /proc/loadavg)"
exec "$bin" "$@"
