#!/usr/bin/env bash
# Installs what building, testing and running Weir needs on Debian 12, and
# nothing that is already there. Sourced by the other hack/ scripts.
set -euo pipefail

weir_packages=(
  clang-19 llvm-19 libbpf-dev linux-libc-dev   # compiling bpf/ (bpf2go)
  bpftool iproute2 util-linux procps           # inspecting the datapath, nsenter
  iperf3 sockperf wrk python3-matplotlib       # benchmarks (also in the lab's loadtools image)
  nginx                                        # the l7-gate benchmark's server
  nghttp2-client                               # h2load: the l7-gate benchmark's HTTP/2 (h2c) load
  runc nftables iptables busybox-static        # the Kubernetes lab: runtime, kube-proxy (both modes), test images
  netcat-openbsd curl bind9-dnsutils socat wget  # the lab's agnhost image: upstream's tools, as in its Alpine base
  git ca-certificates
)

weir_install_deps() {
  local missing=()
  for p in "${weir_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "==> installing Debian packages: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  if ! command -v go >/dev/null 2>&1; then
    for d in /usr/local/go/bin /usr/lib/go/bin; do [[ -x $d/go ]] && export PATH="$d:$PATH"; done
  fi
  if ! command -v go >/dev/null 2>&1; then
    echo "error: no Go toolchain found; install Go 1.22 or newer (go.mod then fetches the pinned toolchain through the module proxy)" >&2
    return 1
  fi
  # go.mod pins the toolchain; an older go downloads it through the module proxy.
  export GOTOOLCHAIN="${GOTOOLCHAIN:-auto}"
  export PATH="$(go env GOPATH)/bin:$PATH"
}

# weir_mount_bpffs mounts a bpf filesystem at /sys/fs/bpf if none is there
# and sets WEIR_BPFFS_MOUNTED=1 so the caller can unmount it afterwards.
weir_mount_bpffs() {
  WEIR_BPFFS_MOUNTED=0
  if [[ "$(stat -f -c %T /sys/fs/bpf 2>/dev/null)" != "bpf_fs" ]]; then
    mkdir -p /sys/fs/bpf
    mount -t bpf bpffs /sys/fs/bpf
    WEIR_BPFFS_MOUNTED=1
  fi
}

weir_umount_bpffs() {
  if [[ "${WEIR_BPFFS_MOUNTED:-0}" == 1 ]]; then
    # Only when nothing of anyone's is pinned any more.
    if [[ -z "$(ls -A /sys/fs/bpf 2>/dev/null | grep -v -e '^maps.debug$' -e '^progs.debug$')" ]]; then
      umount /sys/fs/bpf || true
    fi
  fi
}

weir_build() {
  echo "==> building bin/weir, bin/weir-agent, bin/weir-cni"
  mkdir -p bin
  CGO_ENABLED=0 go build -trimpath -ldflags "$(weir_version_ldflags)" -o bin/ ./cmd/...
}

# weir_version_ldflags stamps the commit the binaries are built from into
# them (`weir version`), whether or not the toolchain stamps VCS data
# itself (GOFLAGS=-buildvcs=false).
weir_version_ldflags() {
  local pkg=github.com/weirnet/weir/internal/version
  local rev
  rev=$(git rev-parse HEAD 2>/dev/null) || return 0
  printf -- '-X %s.commit=%s -X %s.commitTime=%s' "$pkg" "$rev" "$pkg" "$(git log -1 --format=%cI)"
  if [[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]]; then
    printf -- ' -X %s.modified=true' "$pkg"
  fi
}

# weir_lab_build builds (first time only; ~15 min on 2 cores, then cached in
# ~/.cache/weir) what the Kubernetes lab runs: etcd, containerd, Kubernetes,
# agnhost, CoreDNS and the reference CNI plugins.
weir_lab_build() {
  echo "==> building the Kubernetes lab's components (cached after the first run)"
  ./bin/weir lab build
}
