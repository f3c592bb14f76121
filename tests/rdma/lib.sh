# Shared by tests/rdma/vm-check and bench/verbs.sh (sourced, bash): finding
# the rdma-vm tool, the guest image this project's binaries need, and the
# host library directories a guest run must share.
#
#   rdma_vm_find          sets RDMA_VM (the tool), else RDMA_VM_WHY and returns 1
#   rdma_vm_ready         builds the image if needed (root), else sets
#                         RDMA_VM_WHY and returns 1
#   rdma_vm_shares BIN..  prints "--share DIR" for libraries outside /lib, /usr/lib
#   rdma_vm_libpath BIN.. prints those directories as an LD_LIBRARY_PATH
#
# The image lives in $RDMA_VM_DIR (default /var/tmp/dualpath-rdma-vm, apart
# from other projects' images, since rdma-vm rebuilds when the package list
# changes). Its extra packages are the runtime libraries of the test
# binaries; rdma_vm_check_deps fails, naming it, when a binary needs another.

export RDMA_VM_DIR=${RDMA_VM_DIR:-/var/tmp/dualpath-rdma-vm}
export RDMA_VM_EXTRA_PACKAGES="libcaf-core0.17 libcaf-io0.17 libcaf-openssl0.17 liburing2 libxxhash0 librdmacm1 libtomlplusplus3 libssl3 libmicrohttpd12 openssl"

rdma_vm_find() {
  local root dir
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
  if [ -n "${RDMA_VM:-}" ]; then
    [ -x "$RDMA_VM" ] && return 0
    RDMA_VM_WHY="RDMA_VM=$RDMA_VM is not an executable"
    return 1
  fi
  # The shared tool next to the checkout (../shared/tools/rdma-vm), searched
  # upwards from the repository, then $PATH.
  dir=$root
  while [ "$dir" != / ]; do
    if [ -x "$dir/shared/tools/rdma-vm/rdma-vm" ]; then
      RDMA_VM="$dir/shared/tools/rdma-vm/rdma-vm"
      return 0
    fi
    dir=$(dirname "$dir")
  done
  if command -v rdma-vm >/dev/null 2>&1; then
    RDMA_VM=$(command -v rdma-vm)
    return 0
  fi
  RDMA_VM_WHY="the rdma-vm tool was not found (no shared/tools/rdma-vm/rdma-vm above $root, none on PATH; set RDMA_VM)"
  return 1
}

rdma_vm_ready() {
  local t
  # As root, the emulator and debootstrap are installed when missing (the
  # guest is what the RDMA suites need; apt is how this project gets tools).
  if [ "$(id -u)" = 0 ] && ! { command -v qemu-system-x86_64 && command -v qemu-img &&
       command -v debootstrap; } >/dev/null 2>&1; then
    echo "rdma-vm: installing qemu-system-x86 qemu-utils debootstrap" >&2
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q \
      --no-install-recommends qemu-system-x86 qemu-utils debootstrap >/dev/null 2>&1 ||
      { apt-get -o DPkg::Lock::Timeout=600 update -q >/dev/null 2>&1 &&
        DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q \
          --no-install-recommends qemu-system-x86 qemu-utils debootstrap >/dev/null 2>&1; } ||
      echo "rdma-vm: installing them failed" >&2
  fi
  for t in qemu-system-x86_64 qemu-img; do
    if ! command -v "$t" >/dev/null 2>&1; then
      RDMA_VM_WHY="$t is missing (apt-get install --no-install-recommends qemu-system-x86 qemu-utils debootstrap)"
      return 1
    fi
  done
  # rdma-vm build is idempotent: quick when the image matches the packages.
  if [ "$(id -u)" != 0 ]; then
    if [ -f "$RDMA_VM_DIR/rootfs.img" ] && grep -qF "extra=$RDMA_VM_EXTRA_PACKAGES " "$RDMA_VM_DIR/spec" 2>/dev/null; then
      return 0
    fi
    RDMA_VM_WHY="no guest image with this project's packages in $RDMA_VM_DIR, and building one needs root"
    return 1
  fi
  if ! command -v debootstrap >/dev/null 2>&1; then
    RDMA_VM_WHY="debootstrap is missing (apt-get install --no-install-recommends debootstrap qemu-system-x86 qemu-utils)"
    return 1
  fi
  local log
  log=$(mktemp)
  if ! "$RDMA_VM" build >"$log" 2>&1; then
    RDMA_VM_WHY="rdma-vm build failed: $(tail -3 "$log" | tr '\n' ' ')"
    rm -f "$log"
    return 1
  fi
  grep -v '^$' "$log" | sed 's/^/  /' >&2 || true
  rm -f "$log"
  return 0
}

# Host packages of the binaries' libraries that the image lacks (empty:
# none). The image's package list is read once per image (one boot) into
# $RDMA_VM_DIR/dualpath-packages.
rdma_vm_check_deps() {
  local list=$RDMA_VM_DIR/dualpath-packages missing="" p
  if [ ! -s "$list" ] || [ "$list" -ot "$RDMA_VM_DIR/rootfs.img" ]; then
    RDMA_VM_QUIET=1 "$RDMA_VM" run --no-rxe --share /tmp -- \
      dpkg-query -W -f '${Package}\n' 2>/dev/null | sed 's/:.*//' | sort -u >"$list.tmp" || true
    if [ -s "$list.tmp" ]; then mv "$list.tmp" "$list"; else rm -f "$list.tmp"; fi
  fi
  [ -s "$list" ] || { echo "(could not list the image's packages)"; return; }
  for p in $("$RDMA_VM" deps "$@" | grep -v '^not-from-a-package'); do
    grep -qx "$p" "$list" || missing="$missing $p"
  done
  echo "${missing# }"
}

rdma_vm_libdirs() {
  ldd "$@" 2>/dev/null | awk '/=> \//{print $3}' | sort -u | while read -r lib; do
    case "$(readlink -f "$lib")" in
      /lib/*|/usr/lib/*|/lib64/*|/usr/lib64/*) ;;
      *) dirname "$(readlink -f "$lib")" ;;
    esac
  done | sort -u
}

rdma_vm_shares() {
  local d
  for d in $(rdma_vm_libdirs "$@"); do printf -- '--share %s ' "$d"; done
}

rdma_vm_libpath() {
  rdma_vm_libdirs "$@" | paste -sd: -
}
