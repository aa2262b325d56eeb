#!/usr/bin/env bash
# Restarts the local control plane's kube-apiserver with the very flags it runs with (read from
# /proc), as a crash and a restart by its supervisor would: `make chaos` uses it to check that
# the agent carries on by itself. Waits until the new one answers /readyz.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/cluster/env.sh
. "$here/env.sh"

# Every process's command line, while it runs: revive.sh starts one again if it exits.
mkdir -p "$CP_RUN/cmdline"
for name in kube-apiserver kube-controller-manager kube-scheduler kwok; do
  pid=$(cat "$CP_RUN/pid/$name.pid" 2>/dev/null || echo 0)
  if kill -0 "$pid" 2>/dev/null; then cp "/proc/$pid/cmdline" "$CP_RUN/cmdline/$name"; fi
done
pidfile=$CP_RUN/pid/kube-apiserver.pid
pid=$(cat "$pidfile")
mapfile -d '' argv <"/proc/$pid/cmdline"
kill -9 "$pid"
for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
cd "$CP_RUN"
"${argv[@]}" >>logs/kube-apiserver.log 2>&1 &
echo $! >"$pidfile"
deadline=$(($(date +%s) + 120))
until cp_running; do
  [ "$(date +%s)" -lt "$deadline" ] || { echo "kube-apiserver did not come back" >&2; exit 1; }
  sleep 0.2
done
"$here/revive.sh"
