#!/usr/bin/env bash
# bench/run verbs [--runs N] [--bytes B] [--kv-queue-pairs K]: the verbs bulk
# backend against
# perftest's ib_write_bw on the same RDMA device pair, at 64 KiB, 1 MiB and
# 4 MiB writes. On a host without rxe devices it boots the rdma-vm guest
# (tests/rdma/lib.sh; Soft-RoCE rxe1 -> rxe0 there) and runs itself inside.
# Both write from rxe1 to rxe0 with about 16 MiB (at least 4 writes) posted
# at a time (bench_verbs' window and send queue, ib_write_bw's -t); every
# run of either moves the same B bytes (default 96 MiB; ib_write_bw -n), the
# rate is B over the time from the first write to the last completion;
# every tool gets the same number of runs, taken in turns round by round,
# median taken.
#
# bench_verbs runs with K KV queue pairs (transport.verbs_kv_queue_pairs,
# default 2 as the backend's default), each posted and completed on its own
# thread. ib_write_bw runs twice per round: with one queue pair (its
# default) and with K (-q K, the same ~16 MiB spread over them; perftest
# posts to all of them from its one thread). The ratio is against the
# better of the two medians.
#
# Under the rdma-vm guest the devices are Soft-RoCE under software emulation
# (TCG): the absolute rates are the emulator's, tens of MB/s, and say nothing
# about RDMA hardware; only the ratio against ib_write_bw on the same devices
# in the same boot means something.
#
# bench_verbs runs each size twice: `verbs_<size>_hot`, every write from and
# to the same bytes (ib_write_bw's working set: over half a page it posts
# every write from one buffer to one remote address), and `verbs_<size>`,
# writes cycling through 64 MiB regions (as KV blocks land).
#
# Last line:
#   RESULT verbs ratio_64k=A ratio_1m=B ratio_4m=C min_ratio=M
#     cold_64k=D cold_1m=E cold_4m=F kv_queue_pairs=K
# ratio = verbs_<size>_hot median / the better ib_write_bw median, cold =
# verbs_<size> median / the same (GB/s = 1e9 bytes/s); target M >= 1.0.
# BUILD_DIR (set by bench/run) holds the build;
# BENCH_VERBS_BIN names an already built bench_verbs instead.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
BUILD_DIR=${BUILD_DIR:-$root/build-bench}
runs=5
bytes=100663296
kvq=2
args=("$@")
while [ $# -gt 0 ]; do
  case $1 in
    --runs) runs=$2; shift 2 ;;
    --bytes) bytes=$2; shift 2 ;;
    --kv-queue-pairs) kvq=$2; shift 2 ;;
    *) echo "bench verbs: unknown option $1" >&2; exit 2 ;;
  esac
done
bin=${BENCH_VERBS_BIN:-}
if [ -z "$bin" ]; then
  if [ -d /sys/class/infiniband/rxe0 ]; then
    bin=$(find "$BUILD_DIR" -name bench_verbs -type f -perm -u+x | head -1)
  else
    cmake --build "$BUILD_DIR" --target bench_verbs >&2
    bin=$(find "$BUILD_DIR" -name bench_verbs -type f -perm -u+x | head -1)
  fi
fi
[ -x "$bin" ] || { echo "bench verbs: no bench_verbs built in $BUILD_DIR" >&2; exit 1; }

if [ ! -d /sys/class/infiniband/rxe0 ] || [ ! -d /sys/class/infiniband/rxe1 ]; then
  # The host: run this script in the guest.
  . "$root/tests/rdma/lib.sh"
  rdma_vm_find || { echo "bench verbs: $RDMA_VM_WHY" >&2; exit 1; }
  rdma_vm_ready || { echo "bench verbs: $RDMA_VM_WHY" >&2; exit 1; }
  shares=(--share "$root")
  bin=$(readlink -f "$bin")
  case "$bin" in "$root"/*) ;; *) shares+=(--share "$(dirname "$bin")") ;; esac
  for d in $(rdma_vm_libdirs "$bin"); do shares+=(--share "$d"); done
  log=$(mktemp)
  trap 'rm -f "$log"' EXIT
  set +e
  (cd "$root" && "$RDMA_VM" run "${shares[@]}" --timeout 1800 --mem 3072 \
     -e "LD_LIBRARY_PATH=$(rdma_vm_libpath "$bin")" -e "BENCH_VERBS_BIN=$bin" \
     -- bash bench/verbs.sh "${args[@]}") 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  set -e
  grep -E '^RESULT verbs ' "$log" | tail -1
  exit "$rc"
fi

# The guest (or any host with rxe0/rxe1).
ulimit -l unlimited 2>/dev/null || true
tx=rxe1 rx=rxe0 rx_ip=10.77.0.1 gid=1
echo "# Soft-RoCE $tx -> $rx, runs=$runs bytes=$bytes; $(nproc) CPUs; absolute rates are emulation's"
median() { sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
spread() { sort -g | awk 'NR==1{lo=$1} {hi=$1} END {printf "%s..%s", lo, hi}'; }
port=18600
perftest_gbps() { # size qps -> GB/s of one ib_write_bw run of $bytes
  # (nothing for a run that failed or reported 0.00 Gb/s, as a loaded guest
  # sometimes does: such a run is left out, and runs= below says so)
  # The same depth as bench_verbs: about 16 MiB (at least 4 writes) posted,
  # over `qps` queue pairs (-t and -n are per queue pair).
  local size=$1 q=$2 p=$((port++)) depth=$(( 16777216 / $1 / $2 )) iters=$(( bytes / $1 / $2 ))
  [ "$depth" -lt 4 ] && depth=4
  [ "$iters" -lt 1 ] && iters=1
  [ "$depth" -gt "$iters" ] && depth=$iters
  ib_write_bw -d "$rx" -x "$gid" -s "$size" -n "$iters" -t "$depth" -q "$q" -F -p "$p" --report_gbits >/dev/null 2>&1 &
  local srv=$!
  sleep 1
  timeout 600 ib_write_bw -d "$tx" -x "$gid" -s "$size" -n "$iters" -t "$depth" -q "$q" -F -p "$p" \
      --report_gbits "$rx_ip" 2>/dev/null |
    awk -v s="$size" '$1 == s && $4 > 0 {printf "%.5f\n", $4 / 8}' || true
  wait "$srv" 2>/dev/null || true
}
# The tools take turns, round by round (one run of each per round, the same
# order every round), so a drift of the emulator's speed within a boot
# weighs on each alike instead of on whichever ran last.
value_of() { awk '{for(i=1;i<=NF;i++) if ($i ~ /^median_gbps=/) {sub("median_gbps=","",$i); print $i}}'; }
declare -A ours theirs
for pair in "64k 65536" "1m 1048576" "4m 4194304"; do
  set -- $pair
  name=$1 size=$2
  declare -A got=()
  for ((r = 0; r < runs; r++)); do
    for w in "${name}_hot" "$name"; do
      v=$(DUALPATH_VERBS_DEVICE=$tx DUALPATH_VERBS_PEER_DEVICE=$rx \
          "$bin" --runs 1 --bytes "$bytes" --kv-queue-pairs "$kvq" --only "verbs_$w" | value_of)
      [ -n "$v" ] || { echo "bench verbs: bench_verbs verbs_$w failed" >&2; exit 1; }
      got[$w]+="$v "
    done
    for q in $(printf '%s\n' 1 "$kvq" | sort -un); do
      v=$(perftest_gbps "$size" "$q")
      [ -n "$v" ] && got[peer$q]+="$v "
    done
  done
  for w in "${name}_hot" "$name"; do
    ours[$w]=$(printf '%s\n' ${got[$w]} | median)
    echo "verbs_$w size=$size median_gbps=${ours[$w]} spread_gbps=$(printf '%s\n' ${got[$w]} | spread) runs=$runs"
  done
  theirs[$name]=0
  for q in $(printf '%s\n' 1 "$kvq" | sort -un); do
    if [ -z "${got[peer$q]:-}" ]; then
      echo "peer ib_write_bw -q $q size=$size no result"
      continue
    fi
    m=$(printf '%s\n' ${got[peer$q]} | median)
    echo "peer ib_write_bw -q $q size=$size median_gbps=$m spread_gbps=$(printf '%s\n' ${got[peer$q]} | spread) runs=$(printf '%s\n' ${got[peer$q]} | wc -l)"
    theirs[$name]=$(awk -v a="${theirs[$name]}" -v b="$m" 'BEGIN{print (b>a)?b:a}')
  done
  unset got
done
ratio() { awk -v a="${ours[$1]:-0}" -v b="${theirs[$2]:-0}" 'BEGIN{printf "%.3f", (b>0)?a/b:0}'; }
r64=$(ratio 64k_hot 64k) r1=$(ratio 1m_hot 1m) r4=$(ratio 4m_hot 4m)
c64=$(ratio 64k 64k) c1=$(ratio 1m 1m) c4=$(ratio 4m 4m)
min=$(printf '%s\n' "$r64" "$r1" "$r4" | sort -g | head -1)
echo "RESULT verbs ratio_64k=$r64 ratio_1m=$r1 ratio_4m=$r4 min_ratio=$min cold_64k=$c64 cold_1m=$c1 cold_4m=$c4 kv_queue_pairs=$kvq"
