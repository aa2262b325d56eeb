# Shared settings for the local control plane scripts. Sourced, not run.
K8S_VERSION=v1.36.3
LINNET_CACHE=${LINNET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/linnet}
# The cache key covers the pinned module set, so a change to go.mod/go.sum or the build rebuilds.
_cp_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# Bump CP_BUILD_REV when build.sh changes what it produces.
CP_BUILD_REV=1
_cp_key=$( (cat "$_cp_here/go.mod" "$_cp_here/go.sum" "$_cp_here/cmd/etcd/main.go"; echo "$CP_BUILD_REV") | sha256sum | cut -c1-12)
CP_BIN=$LINNET_CACHE/controlplane/$K8S_VERSION-$_cp_key/bin
# Where a running control plane keeps its data, certificates, logs and kubeconfigs.
CP_RUN=${LINNET_CLUSTER_DIR:-${TMPDIR:-/tmp}/linnet-cluster}
CP_ETCD_PORT=${CP_ETCD_PORT:-23791}
CP_ETCD_PEER_PORT=${CP_ETCD_PEER_PORT:-23801}
CP_API_PORT=${CP_API_PORT:-16443}

# True while process $1 runs. A killed process whose parent has not reaped it yet (a zombie)
# has exited, though `kill -0` still finds it; but a Go program's main thread turns zombie
# while its other threads still exit and hold its sockets, so those count as running.
cp_alive() {
  local state tasks
  state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$state" ] || return 1
  if [ "$state" != Z ] && [ "$state" != X ]; then return 0; fi
  tasks=$(find "/proc/$1/task" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
  [ "$tasks" -gt 1 ]
}

# True when a control plane started by up.sh is up and answering.
cp_running() {
  [ -f "$CP_RUN/ready" ] && curl -fsS --max-time 2 --cacert "$CP_RUN/pki/ca.crt" \
    -H "Authorization: Bearer $(cat "$CP_RUN/admin.token")" \
    "https://127.0.0.1:$CP_API_PORT/readyz" >/dev/null 2>&1
}

# Kills kube-controller-manager and kube-scheduler (SIGKILL) and waits until they are gone;
# revive.sh starts them again with the flags they ran with.
cp_kill_controllers() {
  local name pid
  for name in kube-controller-manager kube-scheduler; do
    pid=$(cat "$CP_RUN/pid/$name.pid" 2>/dev/null || echo 0)
    kill -9 "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do cp_alive "$pid" || break; sleep 0.1; done
  done
}
