#!/usr/bin/env bash
# Stops (SIGKILL, like a crashed kubelet) or starts again the real node's kubelet, for the
# tests of a node whose kubelet goes away mid-rollout. Its pods keep running under containerd
# meanwhile, as on a real node.
#
#   tests/node/kubelet.sh stop | start
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/node/env.sh
. "$here/env.sh"
[ -f "$NODE_RUN/kubelet.cmd" ] || { echo "kubelet.sh: the real node is not running" >&2; exit 1; }
pid=$(cat "$NODE_RUN/pid/kubelet.pid" 2>/dev/null || echo 0)
case "${1:-}" in
  stop)
    kill -9 "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do cp_alive "$pid" || exit 0; sleep 0.1; done
    echo "kubelet.sh: the kubelet ($pid) did not stop" >&2; exit 1 ;;
  start)
    if cp_alive "$pid"; then exit 0; fi
    cd "$NODE_RUN"
    ( eval "exec $(cat kubelet.cmd)" ) >>logs/kubelet.log 2>&1 &
    echo $! >pid/kubelet.pid ;;
  *) echo "usage: $0 stop|start" >&2; exit 2 ;;
esac
