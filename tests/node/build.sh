#!/usr/bin/env bash
# Builds the real-node tier into a cache directory outside the checkout: the kubelet from the
# Go module pinned in go.mod (the control plane's release), the tests' key-value server, a
# static `pause` from Kubernetes' own build/pause/linux/pause.c, and their images
# (images.py). Prints the directory on its last line. A warm cache builds nothing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/node/env.sh
. "$here/env.sh"

why=$(node_unsupported)
if [ -n "$why" ]; then
  echo "node/build.sh: not building the real node, this machine cannot run it: $why" >&2
  exit 0
fi
if [ -f "$NODE_BIN/.complete" ]; then
  echo "real node $K8S_VERSION cached in $NODE_BIN" >&2
  echo "$NODE_BIN"
  exit 0
fi
command -v go >/dev/null || { echo "node/build.sh: Go is needed to build the kubelet" >&2; exit 1; }
command -v gcc >/dev/null || { echo "node/build.sh: gcc is needed to build pause" >&2; exit 1; }
mkdir -p "$NODE_BIN.partial"
cd "$here"
export GOFLAGS=-mod=readonly

minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
ldflags="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
  ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done
if [ ! -x "$NODE_BIN.partial/kubelet" ]; then
  echo "building kubelet (k8s.io/kubernetes/cmd/kubelet $K8S_VERSION) ... (a cold build takes minutes; go is compiling, not hung)" >&2
  start=$(date +%s)
  ( while sleep 60; do echo "    ... still building kubelet ($(( $(date +%s) - start ))s)" >&2; done ) &
  ticker=$!
  if ! CGO_ENABLED=0 go build -p 2 -trimpath -ldflags "$ldflags" -o "$NODE_BIN.partial/kubelet" \
    k8s.io/kubernetes/cmd/kubelet; then
    kill "$ticker" 2>/dev/null
    echo "node/build.sh: building the kubelet failed" >&2
    exit 1
  fi
  kill "$ticker" 2>/dev/null; wait "$ticker" 2>/dev/null || true
  echo "    built kubelet in $(( $(date +%s) - start ))s" >&2
fi
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$NODE_BIN.partial/kvserver" ./kvserver
k8s_dir=$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)
gcc -Os -static -DVERSION=3.10.1 -o "$NODE_BIN.partial/pause" "$k8s_dir/build/pause/linux/pause.c"
python3 "$here/images.py" "$NODE_BIN.partial" "$NODE_BIN.partial/images" >/dev/null
touch "$NODE_BIN.partial/.complete"
rm -rf "$NODE_BIN"
mv "$NODE_BIN.partial" "$NODE_BIN"
du -sh "$NODE_BIN" >&2
echo "$NODE_BIN"
