# Shared settings for the real-node scripts (tests/node/). Sourced, not run.
# The node joins the control plane of tests/cluster/ (its env.sh is sourced first).
_node_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=tests/cluster/env.sh
. "$_node_here/../cluster/env.sh"
# Two caches: the kubelet (minutes to build) keyed by the module set alone, and the images
# (seconds) by everything that goes into them. Bump a REV when build.sh changes what it makes.
NODE_KUBELET_REV=1
NODE_IMAGES_REV=1
_node_kubelet_key=$( (cat "$_node_here/go.mod" "$_node_here/go.sum"; echo "$NODE_KUBELET_REV") |
  sha256sum | cut -c1-12)
_node_images_key=$( (cat "$_node_here/go.mod" "$_node_here"/kvserver/*.go "$_node_here/images.py" \
  "$_node_here/../../deploy/image/build.py"; echo "$NODE_IMAGES_REV") | sha256sum | cut -c1-12)
NODE_KUBELET=$LINNET_CACHE/node/kubelet-$K8S_VERSION-$_node_kubelet_key
NODE_IMAGES=$LINNET_CACHE/node/images-$_node_images_key
# Where a running node keeps containerd's state, the kubelet's root, its logs and pids. Not
# under the control plane's run directory: down.sh there removes that directory with rm -rf,
# and the node's directories hold mounts until the node is down.
NODE_RUN=${LINNET_NODE_DIR:-${TMPDIR:-/tmp}/linnet-node}
NODE_NAME=linnet-node-0
# Pod addresses on the node's bridge; kwok's pods use 198.18.0.0/16 (tests/deps.sh).
NODE_POD_CIDR=10.246.0.0/24
NODE_BRIDGE=linnet0
# This machine's address on the bridge: pods reach the host's test servers (a Git server, say)
# there.
NODE_GATEWAY=10.246.0.1
NODE_KUBELET_PORT=${NODE_KUBELET_PORT:-10350}
NODE_KUBELET_HEALTHZ_PORT=${NODE_KUBELET_HEALTHZ_PORT:-10348}
# The taint that keeps kwok-tier pods off the real node; real-node pods tolerate it and select
# the node by the label linnet.dev/node=real.
NODE_TAINT_KEY=linnet.dev/real-node

# Why this machine cannot run the real node, or nothing when it can.
node_unsupported() {
  [ "$(uname -s)" = Linux ] || { echo "the real node needs Linux"; return; }
  [ "$(id -u)" = 0 ] || { echo "the real node runs containerd and a kubelet as root; run as root"; return; }
  grep -qw overlay /proc/filesystems || { echo "the kernel has no overlay filesystem (containerd's snapshotter)"; return; }
  [ -d /sys/fs/cgroup ] || { echo "no cgroup filesystem at /sys/fs/cgroup"; return; }
  command -v containerd >/dev/null && command -v runc >/dev/null && [ -x /usr/lib/cni/bridge ] &&
    command -v iptables >/dev/null ||
    { echo "containerd, runc, iptables or the CNI plugins are missing (tests/deps.sh installs them)"; return; }
  [ -z "${LINNET_NO_NODE:-}" ] || { echo "LINNET_NO_NODE is set"; return; }
}

node_running() {
  [ -f "$NODE_RUN/ready" ] && cp_alive "$(cat "$NODE_RUN/pid/kubelet.pid" 2>/dev/null || echo 0)" &&
    cp_alive "$(cat "$NODE_RUN/pid/containerd.pid" 2>/dev/null || echo 0)"
}
