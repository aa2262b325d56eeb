#!/usr/bin/env bash
# Stops the real node started by up.sh: kills its pods' processes (found by the node's cgroup,
# not by name), the kubelet, the shims and containerd; unmounts what they left under the run
# directory; removes the bridge, the cgroups and the run directory. The volumes' data lives
# under the control plane's run directory and is not touched here. Safe when nothing runs.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/node/env.sh
. "$here/env.sh"

[ -d "$NODE_RUN" ] || exit 0
stop_pid() { # file
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 0
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 50); do cp_alive "$pid" || return 0; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
}
stop_pid "$NODE_RUN/pid/kubelet.pid"
# Every process of every pod lives under the kubelet's cgroup root.
cgroot=linnet-node
for _ in 1 2 3; do
  pids=$(find /sys/fs/cgroup/ -path "*/$cgroot/*" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u)
  [ -n "$pids" ] || break
  # shellcheck disable=SC2086
  kill -9 $pids 2>/dev/null || true
  sleep 0.3
done
sock=$NODE_RUN/containerd.sock
pkill -9 -f "containerd-shim-runc-v2 .*-address $sock" 2>/dev/null || true
stop_pid "$NODE_RUN/pid/containerd.pid"
ip link del "$NODE_BRIDGE" 2>/dev/null || true
if command -v iptables >/dev/null; then
  iptables -t nat -D PREROUTING -j LINNET-NODE 2>/dev/null || true
  iptables -t nat -F LINNET-NODE 2>/dev/null || true
  iptables -t nat -X LINNET-NODE 2>/dev/null || true
fi
# Deepest mounts first (overlay roots, tokens' tmpfs, shm).
findmnt -rn -o TARGET | grep -F "$NODE_RUN/" | sort -r | while read -r m; do
  umount -l "$m" 2>/dev/null || true
done
find /sys/fs/cgroup/ -depth -type d -path "*/$cgroot*" -exec rmdir {} \; 2>/dev/null || true
rm -rf --one-file-system "$NODE_RUN"
echo "node: stopped" >&2
