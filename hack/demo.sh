#!/usr/bin/env bash
# The main job: installs what it needs, builds Weir and (first time only,
# ~15 min on 2 cores, then cached in ~/.cache/weir) the cluster's
# components, brings up a two-node Kubernetes cluster on network namespaces
# with Weir as its CNI, deploys a two-tier demo app and shows its pods
# talking within and across nodes and through a Service; then removes the
# cluster (KEEP=1 leaves it up for you to explore with `bin/weir lab kubectl`).
set -euo pipefail
cd "$(dirname "$0")/.."
source hack/deps.sh

if [[ $EUID -ne 0 ]]; then
  echo "error: the lab needs root (eBPF, network namespaces, cgroups); run: sudo $0" >&2
  exit 1
fi

weir_install_deps
weir_mount_bpffs
weir_build
weir_lab_build
mode="${MODE:-vxlan}"
./bin/weir lab down >/dev/null 2>&1 || true
[[ "${KEEP:-0}" == 1 ]] || trap './bin/weir lab down; weir_umount_bpffs' EXIT

echo "==> weir lab up --demo --mode $mode"
./bin/weir lab up --demo --mode "$mode"
echo
echo "==> weir lab status"
./bin/weir lab status
echo
echo "==> weir status (node n1's agent: its pods, peers and datapath counters)"
./bin/weir status --socket /run/weir-lab/n1/agent.sock | grep -v ' 0$'
if [[ "${KEEP:-0}" == 1 ]]; then
  echo
  echo "cluster left up: try './bin/weir lab kubectl get pods -A -o wide'; remove it with './bin/weir lab down'"
fi
