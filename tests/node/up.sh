#!/usr/bin/env bash
# Starts the real node beside the running local control plane (tests/cluster/up.sh): its own
# containerd (runc, overlayfs, a bridge CNI on 10.246.0.0/24 that this machine reaches
# directly) and a kubelet registered as node linnet-node-0, labelled linnet.dev/node=real and
# tainted linnet.dev/real-node:NoSchedule so that kwok-tier pods stay off it. Loads the test
# images (tests/node/images.py) without a registry. Returns once the node is Ready.
#
#   tests/node/up.sh     start (does nothing if the node already runs)
#   tests/node/down.sh   stop, kill its containers, unmount and remove its run files
#
# Exits 3, saying why, on a machine that cannot run it (not root, no overlayfs, no
# containerd): the kwok tier still runs there.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/node/env.sh
. "$here/env.sh"

log() { echo "node: $*" >&2; }
die() {
  log "$*"
  for f in "$NODE_RUN"/logs/*.log; do
    [ -f "$f" ] || continue
    echo "---- last lines of $f" >&2
    tail -n 20 "$f" >&2
  done
  exit 1
}

why=$(node_unsupported)
if [ -n "$why" ]; then
  log "this machine cannot run the real node: $why"
  exit 3
fi
cp_running || die "the control plane is not running (tests/cluster/up.sh starts it)"
if node_running; then
  log "already running in $NODE_RUN"
  exit 0
fi

"$here/build.sh"
"$here/down.sh" >/dev/null 2>&1 || true
mkdir -p "$NODE_RUN"/{containerd/root,containerd/state,containerd/opt,kubelet,logs,pid,cni/conf,cni/ipam,pki,plugins}
cd "$NODE_RUN"
sock=$NODE_RUN/containerd.sock

# --- cgroups: the kubelet's root, in every v1 hierarchy (or the v2 tree) -------------------
cgroot=linnet-node
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
  mkdir -p "/sys/fs/cgroup/$cgroot"
  for c in $(cat /sys/fs/cgroup/cgroup.controllers); do
    echo "+$c" >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true
    echo "+$c" >"/sys/fs/cgroup/$cgroot/cgroup.subtree_control" 2>/dev/null || true
  done
else
  for h in /sys/fs/cgroup/*/; do
    mkdir -p "$h$cgroot"
  done
  if [ -d /sys/fs/cgroup/cpuset ]; then
    cat /sys/fs/cgroup/cpuset/cpuset.cpus >"/sys/fs/cgroup/cpuset/$cgroot/cpuset.cpus"
    cat /sys/fs/cgroup/cpuset/cpuset.mems >"/sys/fs/cgroup/cpuset/$cgroot/cpuset.mems"
  fi
fi

# --- containerd -----------------------------------------------------------------------------
cat >containerd.toml <<EOF
version = 2
root = "$NODE_RUN/containerd/root"
state = "$NODE_RUN/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$sock"
[debug]
  level = "warn"
[plugins."io.containerd.internal.v1.opt"]
  path = "$NODE_RUN/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10.1"
  enable_selinux = false
  restrict_oom_score_adj = true
  # the pods' network namespaces under the run directory, so down.sh finds and unmounts them
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$NODE_RUN/cni/conf"
EOF

# A bridge with host-local addresses; the host is the bridge's gateway, so tests reach every
# pod at its IP. Made here rather than at the first pod, so that a test can serve pods on the
# gateway's address (NODE_GATEWAY) from the start.
ip link add "$NODE_BRIDGE" type bridge 2>/dev/null || true
ip addr replace "$NODE_GATEWAY/${NODE_POD_CIDR#*/}" dev "$NODE_BRIDGE"
ip link set "$NODE_BRIDGE" up
# No kube-proxy: the one Service pods need, `kubernetes` (10.96.0.1:443, what in-cluster
# clients dial), is sent to the API server on 127.0.0.1 by one DNAT rule in a chain of our own.
sysctl -qw "net.ipv4.conf.$NODE_BRIDGE.route_localnet=1"
iptables -t nat -N LINNET-NODE 2>/dev/null || iptables -t nat -F LINNET-NODE
iptables -t nat -C PREROUTING -j LINNET-NODE 2>/dev/null || iptables -t nat -A PREROUTING -j LINNET-NODE
iptables -t nat -A LINNET-NODE -i "$NODE_BRIDGE" -d 10.96.0.1/32 -p tcp --dport 443 \
  -j DNAT --to-destination "127.0.0.1:$CP_API_PORT"
cat >cni/conf/10-linnet.conflist <<EOF
{
  "cniVersion": "1.0.0",
  "name": "linnet-node",
  "plugins": [
    {"type": "bridge", "bridge": "$NODE_BRIDGE", "isGateway": true, "ipMasq": false,
     "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$NODE_RUN/cni/ipam",
              "ranges": [[{"subnet": "$NODE_POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "loopback"}
  ]
}
EOF

start() { # name args...
  local name=$1; shift
  "$@" >"logs/$name.log" 2>&1 &
  echo $! >"pid/$name.pid"
}
wait_for() { # what seconds command...
  local what=$1 secs=$2; shift 2
  local deadline=$(($(date +%s) + secs))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || die "timed out after ${secs}s waiting for $what"
    sleep 0.3
  done
}

log "starting containerd ($(containerd --version | awk '{print $3}'))"
start containerd containerd --config "$NODE_RUN/containerd.toml"
ctr_() { ctr --address "$sock" -n k8s.io "$@"; }
wait_for containerd 30 ctr_ version
for image in "$NODE_IMAGES"/*.tar; do
  ctr_ images import --no-unpack=false "$image" >/dev/null || die "could not import $image"
done

# --- kubelet ----------------------------------------------------------------------------------
cat >kubelet.yaml <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
containerRuntimeEndpoint: unix://$sock
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: $CP_RUN/pki/ca.crt}
authorization: {mode: AlwaysAllow}
port: $NODE_KUBELET_PORT
healthzBindAddress: 127.0.0.1
healthzPort: $NODE_KUBELET_HEALTHZ_PORT
readOnlyPort: 0
cgroupDriver: cgroupfs
cgroupRoot: /$cgroot
failCgroupV1: false
failSwapOn: false
volumePluginDir: $NODE_RUN/plugins
podLogsDir: $NODE_RUN/logs/pods
resolvConf: /etc/resolv.conf
registerWithTaints:
- {key: $NODE_TAINT_KEY, value: "true", effect: NoSchedule}
# The machine's disk is shared with the build; evict only when it is really full.
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
nodeStatusReportFrequency: 10s
nodeStatusUpdateFrequency: 5s
maxPods: 60
EOF
log "starting the kubelet as node $NODE_NAME"
kubelet_cmd=("$NODE_KUBELET/kubelet" --config "$NODE_RUN/kubelet.yaml"
  --kubeconfig "$CP_RUN/admin.kubeconfig" --hostname-override "$NODE_NAME"
  --root-dir "$NODE_RUN/kubelet" --cert-dir "$NODE_RUN/pki"
  --node-labels "linnet.dev/node=real" --v 1)
# kubelet.sh starts it again with the same command after a test stopped it.
printf '%q ' "${kubelet_cmd[@]}" >kubelet.cmd
start kubelet "${kubelet_cmd[@]}"

api="https://127.0.0.1:$CP_API_PORT"
node_ready() {
  curl -fsS --max-time 5 --cacert "$CP_RUN/pki/ca.crt" -H "Authorization: Bearer $(cat "$CP_RUN/admin.token")" \
    "$api/api/v1/nodes/$NODE_NAME" | python3 -c '
import json, sys
n = json.load(sys.stdin)
ok = any(c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", []))
sys.exit(0 if ok else 1)'
}
wait_for "node $NODE_NAME to be Ready" 90 node_ready
touch ready
log "ready: $NODE_NAME ($(containerd --version | awk '{print $3}'), runc $(runc --version | awk 'NR==1{print $3}')), pods on $NODE_POD_CIDR, run files in $NODE_RUN"
