#!/usr/bin/env bash
# Restarts the local control plane's kube-apiserver with the very flags it runs with (read from
# /proc), as a crash and a restart by its supervisor would: `make chaos` uses it to check that
# the agent carries on by itself. Waits until the new one answers /readyz.
#
# With --with-controllers, kube-controller-manager and kube-scheduler are restarted too, as a
# control-plane node's restart would. `make chaos` uses it: after an API server restart alone,
# the controller-manager's client-go reflectors back their watches off for up to a minute (a
# StatefulSet scaled after each of 4 restarts in a row, no linnet running, was acted on after
# 0.9, 9.3, 53.2 and 29.0 s), which would measure the controller-manager rather than linnet.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/cluster/env.sh
. "$here/env.sh"

# Every process's command line, while it runs: revive.sh starts one again if it exits.
mkdir -p "$CP_RUN/cmdline"
for name in kube-apiserver kube-controller-manager kube-scheduler kwok; do
  pid=$(cat "$CP_RUN/pid/$name.pid" 2>/dev/null || echo 0)
  if cp_alive "$pid"; then cp "/proc/$pid/cmdline" "$CP_RUN/cmdline/$name"; fi
done
with_controllers=false
[ "${1:-}" = --with-controllers ] && with_controllers=true
pidfile=$CP_RUN/pid/kube-apiserver.pid
pid=$(cat "$pidfile")
mapfile -d '' argv <"/proc/$pid/cmdline"
kill -9 "$pid"
for _ in $(seq 1 50); do cp_alive "$pid" || break; sleep 0.1; done
# Its port, too: the new one cannot listen before the old one's socket is gone.
for _ in $(seq 1 50); do
  [ -n "$(ss -Hltn "sport = :$CP_API_PORT")" ] || break
  sleep 0.1
done
if $with_controllers; then
  # They die with it and come back after it (revive.sh below).
  cp_kill_controllers
fi
cd "$CP_RUN"
"${argv[@]}" >>logs/kube-apiserver.log 2>&1 &
echo $! >"$pidfile"
deadline=$(($(date +%s) + 120))
until cp_running; do
  [ "$(date +%s)" -lt "$deadline" ] || { echo "kube-apiserver did not come back" >&2; exit 1; }
  sleep 0.2
done
"$here/revive.sh"
