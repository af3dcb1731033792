#!/usr/bin/env bash
# The main job: builds Weir, brings up a two-node lab (nodes and pods are
# network namespaces, each node runs its own weir-agent, pods are attached
# through libcni), shows the agents' view and the connectivity matrix, and
# removes the lab again (KEEP=1 leaves it up for you to explore).
set -euo pipefail
cd "$(dirname "$0")/.."
source hack/deps.sh

if [[ $EUID -ne 0 ]]; then
  echo "error: the lab needs root (eBPF, network namespaces); run: sudo $0" >&2
  exit 1
fi

weir_install_deps
weir_build
mode="${MODE:-vxlan}"
./bin/weir lab down >/dev/null 2>&1 || true
[[ "${KEEP:-0}" == 1 ]] || trap './bin/weir lab down' EXIT

echo "==> weir lab up --bare --nodes 2 --pods 2 --mode $mode"
./bin/weir lab up --bare --nodes 2 --pods 2 --mode "$mode"
echo
echo "==> weir status (node n1's agent)"
./bin/weir status --socket /run/weir-lab/n1/agent.sock | grep -v '^  counter'
echo
echo "==> weir lab check: TCP, UDP and ICMP between every pod, node and the outside host"
./bin/weir lab check
echo
echo "==> datapath counters on n1 (packets delivered straight into pods, tunnelled, ...)"
./bin/weir status --socket /run/weir-lab/n1/agent.sock | grep '^  counter' | grep -v ' 0$'
if [[ "${KEEP:-0}" == 1 ]]; then
  echo "lab left up: try 'nsenter --net=/var/run/netns/weir-lab-n1-p1 ping 10.244.2.2'; remove it with './bin/weir lab down'"
fi
