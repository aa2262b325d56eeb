#!/usr/bin/env bash
# Stops the local control plane started by up.sh and removes its run directory, so the next
# up.sh starts from nothing. Safe to run when nothing is running.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/cluster/env.sh
. "$here/env.sh"

# The real node first (tests/node/): its pods' volumes live in this run directory. Not for
# another control plane beside the test cluster (CP_NO_NODE=1: a fleet test's): the node is
# the test cluster's.
if [ -z "${CP_NO_NODE:-}" ]; then "$here/../node/down.sh" || true; fi
[ -d "$CP_RUN" ] || exit 0
# Stop in reverse order of start, so nothing logs errors about a vanished API server.
for name in kwok kube-scheduler kube-controller-manager kube-apiserver etcd; do
  f=$CP_RUN/pid/$name.pid
  [ -f "$f" ] || continue
  pid=$(cat "$f")
  kill "$pid" 2>/dev/null || continue
  for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
done
rm -rf "$CP_RUN"
echo "cluster: stopped" >&2
