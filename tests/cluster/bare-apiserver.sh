#!/usr/bin/env bash
# Starts a second kube-apiserver beside the local control plane's, on port $1, with the same
# flags and certificates but its own etcd prefix: an empty cluster, without linnet's CRDs or
# anything the tests made. Prints the path of an admin kubeconfig for it; stop it with
# `kill $(cat "$CP_RUN/pid/bare-apiserver-$1.pid")`. The mistake tests use it to see what a
# person gets from a cluster where linnet is not installed, without uninstalling it from the
# cluster every other test uses.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/cluster/env.sh
. "$here/env.sh"

port=$1
cp_running || { echo "the local control plane is not running" >&2; exit 1; }
mapfile -d '' argv <"/proc/$(cat "$CP_RUN/pid/kube-apiserver.pid")/cmdline"
args=()
skip=false
for a in "${argv[@]}"; do
  if $skip; then skip=false; continue; fi
  case $a in
    # Its own port, and no audit log: the bench counts the main server's requests only.
    --secure-port | --audit-policy-file | --audit-log-path | --audit-log-maxsize | --audit-log-maxbackup)
      skip=true ;;
    --secure-port=* | --audit-*) ;;
    *) args+=("$a") ;;
  esac
done
cd "$CP_RUN"
"${args[@]}" --secure-port "$port" --etcd-prefix "/bare-$port" \
  >>"logs/bare-apiserver-$port.log" 2>&1 &
echo $! >"pid/bare-apiserver-$port.pid"
deadline=$(($(date +%s) + 120))
until curl -fsS --max-time 2 --cacert pki/ca.crt -H "Authorization: Bearer $(cat admin.token)" \
  "https://127.0.0.1:$port/readyz" >/dev/null 2>&1; do
  [ "$(date +%s)" -lt "$deadline" ] || { echo "the bare kube-apiserver did not start" >&2; exit 1; }
  sleep 0.3
done
sed "s|https://127.0.0.1:$CP_API_PORT|https://127.0.0.1:$port|" admin.kubeconfig \
  >"bare-$port.kubeconfig"
echo "$CP_RUN/bare-$port.kubeconfig"
