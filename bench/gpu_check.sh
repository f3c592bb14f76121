#!/usr/bin/env bash
# bench/gpu_check.sh: the GPU check of the gpu module, in one go (well under
# 5 minutes on a GPU machine):
#   1. builds the gpu library, its cuda suite (tests/gpu/cuda_device.cpp) and
#      bench/gpu_copy.cpp directly with nvcc (sm_90) and g++, so it needs only
#      CUDA, g++ and CAF 0.17.6 + doctest headers, not the whole tree's
#      dependencies;
#   2. runs the cuda suite (real device memory, the device checksum kernel);
#   3. runs bench_gpu_copy: per-copy submission cost of cudaMemcpyAsync vs
#      cudaMemcpyBatchAsync for 61 layers x 64 tokens x 656 B Layer Block
#      chunks, and layer H2D/D2H bandwidth from pinned memory.
# Prints a table and, last, `RESULT gpu_copy ... cuda_suite=<passed|failed|
# skipped>`. Without nvcc, CAF headers or a GPU it says so and skips (exit 0).
#
#   bench/gpu_check.sh             build + run (logs under $OUT if set, else
#                                  build-gpucheck/out)
#   bench/gpu_check.sh fetch-deps  (on a build machine with apt) download the
#                                  CAF and doctest .debs (~1 MB) into .gpudeps/
#                                  for a bare GPU machine; carry .gpudeps there.
# On a bare GPU machine run this script directly, not through bench/run (which
# first builds the whole tree with every Debian dependency): e.g. the device
# tool's run with command "bench/gpu_check.sh" and carry [".gpudeps"].
# Environment: NVCC (default /usr/local/cuda/bin/nvcc), CXX (default g++),
# CUDA_ARCH (default 90), GPU_CHECK_BUILD (default build-gpucheck), JOBS,
# GPU_CHECK_USE_DEBS=1 (use .gpudeps even where the system has CAF).
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

skip() {
  echo "SKIP gpu_check: $*"
  echo "RESULT gpu_copy skipped=1 cuda_suite=skipped"
  exit 0
}

if [ "${1:-run}" = fetch-deps ]; then
  mkdir -p .gpudeps
  grep -qx '/.gpudeps/' .git/info/exclude 2>/dev/null \
    || echo '/.gpudeps/' >>.git/info/exclude
  (cd .gpudeps && apt-get download libcaf-dev libcaf-core0.17 doctest-dev) \
    || { echo "gpu_check: apt-get download failed" >&2; exit 1; }
  ls -l .gpudeps
  echo "gpu_check: carry .gpudeps to the GPU machine"
  exit 0
fi

nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
cxx=${CXX:-g++}
arch=${CUDA_ARCH:-90}
build=${GPU_CHECK_BUILD:-$root/build-gpucheck}
out=${OUT:-$build/out}
jobs=${JOBS:-$(nproc)}
[ -x "$nvcc" ] || skip "no nvcc at $nvcc"
command -v "$cxx" >/dev/null || skip "no C++ compiler ($cxx)"
cuda_home=$(cd "$(dirname "$nvcc")/.." && pwd)
mkdir -p "$build/obj" "$out"

# CAF 0.17.6 and doctest: the system's, else unpacked from carried .debs.
incs=()
libdirs=()
unpack() { # a .deb into a folder, without dpkg if need be
  mkdir -p "$2"
  if command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "$1" "$2"
  else
    local member
    member=$(ar t "$1" | grep '^data\.tar') || return 1
    ar p "$1" "$member" | tar -x -a -f - -C "$2" 2>/dev/null \
      || ar p "$1" "$member" | tar -x -J -C "$2"
  fi
}
if [ -n "${GPU_CHECK_USE_DEBS:-}" ] || [ ! -f /usr/include/caf/config.hpp ] \
  || [ ! -f /usr/include/doctest/doctest.h ]; then
  debs=(.gpudeps/*.deb)
  [ -e "${debs[0]}" ] || skip "CAF 0.17.6 / doctest headers not found; run 'bench/gpu_check.sh fetch-deps' on a build machine and carry .gpudeps"
  rm -rf "$build/deps"
  for d in "${debs[@]}"; do unpack "$d" "$build/deps" || skip "cannot unpack $d"; done
  echo "== CAF and doctest from .gpudeps (unpacked under $build/deps)"
  incs+=(-isystem "$build/deps/usr/include")
  libdirs+=(-L"$build/deps/usr/lib/x86_64-linux-gnu" -Wl,-rpath,"$build/deps/usr/lib/x86_64-linux-gnu")
fi

echo "== gpu_check: $(date -u +%FT%TZ) on $(hostname)"
command -v nvidia-smi >/dev/null && nvidia-smi -L
"$nvcc" --version | tail -1
"$cxx" --version | head -1

# -- build ---------------------------------------------------------------------
defs=(-DDUALPATH_HAVE_CUDA=1 "-DDUALPATH_SOURCE_DIR=\"$root\"" "-DDUALPATH_BINARY_DIR=\"$build\"")
cxxflags=(-std=c++17 -O2 -g -Wall -Wextra -I"$root" -isystem "$cuda_home/include" "${incs[@]}" "${defs[@]}")
srcs=(gpu/*.cpp tests/gpu/cuda_device.cpp tests/support/support.cpp tests/support/doctest_main.cpp bench/gpu_copy.cpp)
t0=$(date +%s)
"$nvcc" -std=c++17 -O2 -arch=sm_"$arch" -I"$root" -c gpu/cuda_checksum.cu \
  -o "$build/obj/cuda_checksum.o" >"$out/build.log" 2>&1 &
nvcc_pid=$!
build_ok=1
rm -f "$build"/obj/*.cpp.o
printf '%s\n' "${srcs[@]}" | xargs -P "$jobs" -I{} bash -c \
  'src=$1; shift; o="'"$build"'/obj/$(echo "$src" | tr / _).o"; "$@" -c "$src" -o "$o"' _ {} "$cxx" "${cxxflags[@]}" \
  >>"$out/build.log" 2>&1 || build_ok=0
wait "$nvcc_pid" || build_ok=0
if [ "$build_ok" != 1 ]; then
  tail -40 "$out/build.log"
  echo "RESULT gpu_copy failed=1 cuda_suite=failed stage=build"
  exit 1
fi
lib_objs=("$build/obj/cuda_checksum.o")
for s in gpu/*.cpp; do lib_objs+=("$build/obj/$(echo "$s" | tr / _).o"); done
ldflags=("${libdirs[@]}" -L"$cuda_home/lib64" -Wl,-rpath,"$cuda_home/lib64" -lcudart -lcaf_core -lpthread -ldl -lrt)
"$cxx" -o "$build/test_gpu_cuda_device" "$build/obj/tests_gpu_cuda_device.cpp.o" \
  "$build/obj/tests_support_support.cpp.o" "$build/obj/tests_support_doctest_main.cpp.o" \
  "${lib_objs[@]}" "${ldflags[@]}" >>"$out/build.log" 2>&1 || build_ok=0
"$cxx" -o "$build/bench_gpu_copy" "$build/obj/bench_gpu_copy.cpp.o" "${lib_objs[@]}" \
  "${ldflags[@]}" >>"$out/build.log" 2>&1 || build_ok=0
if [ "$build_ok" != 1 ]; then
  tail -40 "$out/build.log"
  echo "RESULT gpu_copy failed=1 cuda_suite=failed stage=link"
  exit 1
fi
echo "== built in $(( $(date +%s) - t0 )) s (sm_$arch)"
[ -n "${incs[*]}" ] && export LD_LIBRARY_PATH="$build/deps/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# -- the cuda suite --------------------------------------------------------------
echo "== cuda suite (tests/gpu/cuda_device.cpp)"
timeout 180 "$build/test_gpu_cuda_device" 2>&1 | tee "$out/cuda_device.log"
rc=${PIPESTATUS[0]}
case $rc in
  0) suite=passed ;;
  77) suite=skipped ;;
  *) suite=failed ;;
esac
echo "== cuda suite: $suite (exit $rc)"

# -- the copy benchmark ----------------------------------------------------------
echo "== bench_gpu_copy"
timeout 180 "$build/bench_gpu_copy" 2>&1 | tee "$out/gpu_copy.txt"
brc=${PIPESTATUS[0]}
result=$(grep '^RESULT gpu_copy' "$out/gpu_copy.txt" | tail -1)
[ -n "$result" ] || result="RESULT gpu_copy failed=1 exit=$brc"
echo "$result cuda_suite=$suite"
[ "$suite" != failed ] && { [ "$brc" = 0 ] || [ "$brc" = 77 ]; }
