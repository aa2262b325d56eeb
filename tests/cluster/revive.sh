#!/usr/bin/env bash
# Starts again, with the very flags it ran with, any control-plane process of the local cluster
# that has exited, as a supervisor (systemd, the kubelet) would. In a `make chaos` run (which
# restarts the API server 20 times) the kube-scheduler exited after a restart, its last log
# line "Scheduler cache is corrupted", and nothing was scheduled after it.
# restart-apiserver.sh records each process's command line while it runs (cmdline/).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/cluster/env.sh
. "$here/env.sh"

cd "$CP_RUN"
[ -d cmdline ] || exit 0
for saved in cmdline/*; do
  name=$(basename "$saved")
  pid=$(cat "pid/$name.pid" 2>/dev/null || echo 0)
  if cp_alive "$pid"; then continue; fi
  mapfile -d '' argv <"$saved"
  echo "revive.sh: $name had exited; starting it again" >&2
  "${argv[@]}" >>"logs/$name.log" 2>&1 &
  echo $! >"pid/$name.pid"
done
