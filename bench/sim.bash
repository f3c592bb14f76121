# Sourced by the bench/sim-*.sh scripts (not a benchmark itself):
#   source "$(dirname "${BASH_SOURCE[0]}")/sim.bash" NAME
# builds dualpath in BUILD_DIR (default build-bench, as bench/run sets it) and
# sets `bin` (the dualpath binary) and `out` (a scratch folder
# ${TMPDIR:-/tmp}/NAME-XXXXXX, removed when the script exits).
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$root/build-bench}
cmake --build "$BUILD_DIR" --target dualpath >&2
bin=$BUILD_DIR/bin/dualpath
out=$(mktemp -d "${TMPDIR:-/tmp}/$1-XXXXXX")
trap 'rm -rf "$out"' EXIT
