#!/usr/bin/env bash
# Runs a command with the local control plane up, and the real node beside it where the
# machine can run one (tests/node/): starts each that is not running, and stops afterwards
# (also when the command fails) what this script started. Where the machine cannot run the
# node, says why and exports it as LINNET_NODE_UNSUPPORTED: the real-node tests then print it
# and check nothing, and the kwok tier runs as before. Exits with the command's status.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/cluster/env.sh
. "$here/env.sh"
# shellcheck source=tests/node/env.sh
. "$here/../node/env.sh"

started=0
if ! cp_running; then
  "$here/up.sh" || exit 1
  started=1
fi
node_started=0
why=$(node_unsupported)
if [ -n "$why" ]; then
  echo "cluster: the real-node tier will not run here: $why" >&2
  export LINNET_NODE_UNSUPPORTED=$why
elif ! node_running; then
  "$here/../node/up.sh" || { [ "$started" = 1 ] && "$here/down.sh"; exit 1; }
  node_started=1
fi
stop() {
  if [ "$node_started" = 1 ]; then "$here/../node/down.sh"; fi
  if [ "$started" = 1 ]; then "$here/down.sh"; fi
}
trap stop EXIT
trap 'exit 130' INT TERM
export LINNET_CLUSTER_DIR=$CP_RUN LINNET_NODE_DIR=$NODE_RUN
"$@"
