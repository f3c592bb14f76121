#!/usr/bin/env bash
# bench/run scheduler [--runs N] [--periods N] [--only WORKLOAD]: CPU cost of
# the placement policies at 48P96D scale (1,152 engines in 144 groups, 2,400
# requests/s, ~7,000 waiting). Last line:
#   RESULT scheduler cores_at_48p96d=X decisions_per_s=Y   (target X < 0.1)
# BUILD_DIR (set by bench/run) holds an optimised build.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BUILD_DIR=${BUILD_DIR:-$root/build-bench}
cmake --build "$BUILD_DIR" --target bench_scheduler >&2
exec "$BUILD_DIR/bin/bench_scheduler" "$@"
