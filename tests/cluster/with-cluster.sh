#!/usr/bin/env bash
# Runs a command with the local control plane up: starts it if it is not running, and stops it
# afterwards (also when the command fails) if this script started it. Exits with the
# command's status.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/cluster/env.sh
. "$here/env.sh"

started=0
if ! cp_running; then
  "$here/up.sh" || exit 1
  started=1
fi
stop() { if [ "$started" = 1 ]; then "$here/down.sh"; fi; }
trap stop EXIT
trap 'exit 130' INT TERM
export LINNET_CLUSTER_DIR=$CP_RUN
"$@"
