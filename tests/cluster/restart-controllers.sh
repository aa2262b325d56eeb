#!/usr/bin/env bash
# Restarts kube-controller-manager and kube-scheduler with the flags they run with. After a
# kube-apiserver restart alone their client-go watches back off for up to a minute (see
# restart-apiserver.sh); a test that restarts the API server alone calls this when it is
# done, so that the tests after it do not wait on a lagging controller-manager.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/cluster/env.sh
. "$here/env.sh"

mkdir -p "$CP_RUN/cmdline"
for name in kube-controller-manager kube-scheduler; do
  pid=$(cat "$CP_RUN/pid/$name.pid" 2>/dev/null || echo 0)
  if cp_alive "$pid"; then cp "/proc/$pid/cmdline" "$CP_RUN/cmdline/$name"; fi
done
cp_kill_controllers
"$here/revive.sh"
