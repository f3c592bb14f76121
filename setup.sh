#!/usr/bin/env bash
# dualpath setup: installs the Debian packages the build needs (idempotent, waits on
# the apt lock), configures and builds. With `test`, also runs the whole test suite.
#
#   ./setup.sh            install + build (build/ by default, BUILD_DIR overrides)
#   ./setup.sh test       install + build + ctest (every suite)
#   ./setup.sh deps       install packages only
#
# Environment: BUILD_DIR, BUILD_TYPE (default RelWithDebInfo), BUILD_TYPE_FLAGS (the
# compiler flags of that build type, instead of CMake's defaults for it, e.g. "-O1 -g1"),
# SUITE_FLAGS (extra flags for the test suites' own sources only, e.g. "-O0"),
# SANITIZE (address|thread), CUDA_ARCH (default 90), JOBS (default nproc).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cd "$here"

packages=(build-essential cmake ninja-build pkg-config
  libcaf-dev libmsgpack-cxx-dev doctest-dev libibverbs-dev librdmacm-dev liburing-dev
  libtomlplusplus-dev libcli11-dev nlohmann-json3-dev libxxhash-dev libssl-dev openssl
  libmicrohttpd-dev zlib1g-dev clang-format fio iperf3 ucx-utils gnuplot-nox curl procps
  python3-prometheus-client prometheus clang-14 libclang-rt-14-dev
  python3-dev pybind11-dev python3-torch)

install_deps() {
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -eq 0 ]; then
    return 0
  fi
  echo "setup: installing ${missing[*]}"
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get -o DPkg::Lock::Timeout=600 update -q
  $sudo apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "${missing[@]}"
}

build() {
  local dir=${BUILD_DIR:-build}
  local type=${BUILD_TYPE:-RelWithDebInfo}
  local args=(-G Ninja -S . -B "$dir" -DCMAKE_BUILD_TYPE="$type")
  [ -n "${BUILD_TYPE_FLAGS:-}" ] && args+=(-DCMAKE_CXX_FLAGS_"${type^^}"="$BUILD_TYPE_FLAGS")
  [ -n "${SANITIZE:-}" ] && args+=(-DDUALPATH_SANITIZE="$SANITIZE")
  [ -n "${SUITE_FLAGS:-}" ] && args+=(-DDUALPATH_SUITE_FLAGS="$SUITE_FLAGS")
  [ -n "${CUDA_ARCH:-}" ] && args+=(-DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH")
  cmake "${args[@]}" >/dev/null
  cmake --build "$dir" -j "${JOBS:-$(nproc)}"
}

case "${1:-build}" in
  deps) install_deps ;;
  build) install_deps; build ;;
  test)
    install_deps; build
    ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "${JOBS:-$(nproc)}" "${@:2}"
    ;;
  *) echo "usage: ./setup.sh [build|test|deps] [ctest args...]" >&2; exit 2 ;;
esac
