#!/usr/bin/env bash
# bench/gpu_check.sh: the GPU check, one prepared script (about 2 minutes on an
# H200, well under 5). On a machine with an NVIDIA GPU it runs, from binaries
# built elsewhere:
#   1. the cuda suite (tests/gpu/cuda_device.cpp): real device memory, the
#      pool, completion notices, batched copies, the checksum kernels,
#      dma-buf export where the machine has it;
#   2. bench_gpu_copy: host submit time per copy of 3,904 Layer Block rows
#      (61 layers x 64 tokens x 656 B), one cudaMemcpyAsync each against one
#      cudaMemcpyBatchAsync for the list, and H2D GB/s at Layer Block and
#      layer sizes against one plain cudaMemcpy of the same bytes;
#   3. a small `dualpath run --set gpu.backend=cuda` (1P1D x 2 GPUs, three
#      modes): every request completes with every block verified, in CUDA
#      device memory (the JSON's gpu.backend must be "cuda").
# It fails (exit 1) when a device exists and anything fails, a driver too old
# for the binaries' CUDA runtime included; it skips (exit 0, "SKIP ...") only
# where no NVIDIA device exists. The last line is
# `RESULT gpu_check suite=<passed|failed> bench=<...> run=<...> ...`.
#
#   bench/gpu_check.sh pack   on a build machine (this tree's dependencies,
#                             nvcc): builds dualpath, the cuda suite and
#                             bench_gpu_copy with CUDA (in $GPU_CHECK_BUILD,
#                             default build/) and packs them, stripped, with
#                             the shared libraries a bare CUDA machine lacks,
#                             into .gpucheck/ (git-ignored, ~15 MiB)
#   bench/gpu_check.sh        on the GPU machine: runs the check from
#                             .gpucheck/ (else from $GPU_CHECK_BIN, or the
#                             build tree of bench/run or build/)
# With the device tool: run `bench/gpu_check.sh pack` here, then one run with
# command "bench/gpu_check.sh" and carry [".gpucheck"], timeout_s 420. Logs
# and the run's JSON go to $OUT (else .gpucheck/out).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
pack_dir=$root/.gpucheck

# -- pack (build machine) ------------------------------------------------------
if [ "${1:-run}" = pack ]; then
  set -e
  build=${GPU_CHECK_BUILD:-$root/build}
  if [ ! -f "$build/CMakeCache.txt" ]; then
    launcher=()
    command -v ccache >/dev/null \
      && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
    cmake -G Ninja -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}"
  fi
  cmake --build "$build" -j"${JOBS:-2}" --target dualpath test_gpu_cuda_device bench_gpu_copy
  if ! grep -q 'DUALPATH_HAVE_CUDA=1' "$build/compile_commands.json" 2>/dev/null; then
    echo "gpu_check pack: $build was configured without CUDA (no nvcc?)" >&2
    exit 1
  fi
  rm -rf "$pack_dir"
  mkdir -p "$pack_dir/bin" "$pack_dir/lib"
  exclude=$(git rev-parse --git-path info/exclude)
  mkdir -p "$(dirname "$exclude")"
  grep -qx '/.gpucheck/' "$exclude" 2>/dev/null || echo '/.gpucheck/' >>"$exclude"
  bins=("$build/bin/dualpath" "$build/tests/test_gpu_cuda_device" "$build/bin/bench_gpu_copy")
  for b in "${bins[@]}"; do
    objcopy --strip-debug "$b" "$pack_dir/bin/$(basename "$b")"
  done
  # Every shared library the binaries load, except the C/C++ runtime (the
  # GPU machine's is as new or newer) and the CUDA driver (the machine's).
  ldd "${bins[@]}" | awk '/=> \// {print $3}' | sort -u | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*|\
      libstdc++.so.*|libgcc_s.so.*|libcuda.so.*) ;;
      *) cp -L "$lib" "$pack_dir/lib/" ;;
    esac
  done
  (cd "$root" && git rev-parse HEAD) >"$pack_dir/commit"
  du -sh "$pack_dir"
  echo "gpu_check pack: carry .gpucheck to the GPU machine and run bench/gpu_check.sh there"
  exit 0
fi

# -- run (GPU machine) ---------------------------------------------------------
out=${OUT:-$pack_dir/out}
mkdir -p "$out"
result() { # suite bench run extra...
  echo "RESULT gpu_check suite=$1 bench=$2 run=$3${4:+ $4}"
}

# Is there an NVIDIA device at all? Only its absence lets the check skip.
device=""
if command -v nvidia-smi >/dev/null; then
  device=$(nvidia-smi -L 2>/dev/null | grep -m1 '^GPU ' || true)
fi
if [ -z "$device" ] && ls /dev/nvidia[0-9]* >/dev/null 2>&1; then
  device="an NVIDIA device node ($(ls /dev/nvidia[0-9]* | head -1))"
fi
if [ -z "$device" ]; then
  echo "SKIP gpu_check: no NVIDIA device (nvidia-smi lists none, no /dev/nvidia0)"
  result skipped skipped skipped
  exit 0
fi

# The binaries.
if [ -n "${GPU_CHECK_BIN:-}" ]; then
  bin=$GPU_CHECK_BIN
  suite_bin=$bin/test_gpu_cuda_device
elif [ -x "$pack_dir/bin/dualpath" ]; then
  bin=$pack_dir/bin
  suite_bin=$bin/test_gpu_cuda_device
  export LD_LIBRARY_PATH="$pack_dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  tree=${BUILD_DIR:-$root/build}
  bin=$tree/bin
  suite_bin=$tree/tests/test_gpu_cuda_device
fi
for b in "$bin/dualpath" "$bin/bench_gpu_copy" "$suite_bin"; do
  if [ ! -x "$b" ]; then
    echo "FAIL gpu_check: $b is missing; run 'bench/gpu_check.sh pack' on a build machine and carry .gpucheck"
    result failed failed failed "stage=binaries"
    exit 1
  fi
done

echo "== gpu_check $(date -u +%FT%TZ) on $(hostname): $device"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
[ -f "$pack_dir/commit" ] && echo "== binaries of commit $(cat "$pack_dir/commit")"
t_start=$(date +%s)

# 1. The cuda suite: 0 is the only pass (77, "no device", is a failure here:
# a device exists).
echo "== 1/3 cuda suite"
timeout 240 "$suite_bin" 2>&1 | tee "$out/cuda_suite.log"
rc=${PIPESTATUS[0]}
suite=failed
[ "$rc" = 0 ] && suite=passed
echo "== cuda suite: $suite (exit $rc)"

# 2. The copy benchmark.
echo "== 2/3 bench_gpu_copy"
timeout 180 "$bin/bench_gpu_copy" --runs 10 --warmups 2 2>&1 | tee "$out/gpu_copy.txt"
rc=${PIPESTATUS[0]}
bench=failed
[ "$rc" = 0 ] && bench=passed
copy_result=$(grep '^RESULT gpu_copy' "$out/gpu_copy.txt" | tail -1 | sed 's/^RESULT gpu_copy //')
echo "== bench_gpu_copy: $bench (exit $rc)"

# 3. A small emulated run with the KV in CUDA device memory.
echo "== 3/3 dualpath run --set gpu.backend=cuda"
store=$(mktemp -d /tmp/gpu-check-store.XXXXXX)
timeout 240 "$bin/dualpath" run --quiet --agents 8 --prefill-nodes 1 --decode-nodes 1 \
  --set hardware.gpus_per_node=2 --byte-scale 656 --time-scale 20 --turns 2 \
  --mode basic,dualpath,oracle --store-dir "$store/store" --set gpu.backend=cuda \
  --json "$out/run.json" 2>&1 | tee "$out/run.log"
rc=${PIPESTATUS[0]}
rm -rf "$store"
run=failed
run_why="exit $rc"
if [ "$rc" = 0 ] && [ -s "$out/run.json" ]; then
  run_why=$(python3 - "$out/run.json" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
gpu = doc.get("gpu", {})
problems = []
if gpu.get("backend") != "cuda":
    problems.append("gpu.backend is %r, not cuda (%s)" % (gpu.get("backend"), gpu.get("reason")))
for name, m in doc.get("modes", {}).items():
    if m.get("failed_requests", 1) != 0:
        problems.append("%s: %s failed requests" % (name, m.get("failed_requests")))
    if m.get("verify_failures", 1) != 0:
        problems.append("%s: %s verify failures" % (name, m.get("verify_failures")))
    if m.get("blocks_verified", 0) <= 0:
        problems.append("%s: no block verified" % name)
    if m.get("requests") != doc.get("requests_per_mode"):
        problems.append("%s: %s of %s requests" % (name, m.get("requests"), doc.get("requests_per_mode")))
if not doc.get("modes"):
    problems.append("no modes in the JSON")
if problems:
    print("; ".join(problems))
    sys.exit(1)
print("ok: " + ", ".join("%s %d blocks verified" % (k, v["blocks_verified"]) for k, v in doc["modes"].items()))
EOF
  ) && run=passed
fi
echo "== dualpath run: $run ($run_why)"

echo "== gpu_check done in $(( $(date +%s) - t_start )) s"
result "$suite" "$bench" "$run" "${copy_result}"
[ "$suite" = passed ] && [ "$bench" = passed ] && [ "$run" = passed ]
