#!/usr/bin/env bash
# Builds the real-node tier into caches outside the checkout (tests/node/env.sh names them):
# the kubelet from the Go module pinned in go.mod (the control plane's release); and the
# tests' key-value server, a static `pause` from Kubernetes' own build/pause/linux/pause.c, and
# their images (images.py). A warm cache builds nothing. Does nothing, saying why, on a
# machine that cannot run the node.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/node/env.sh
. "$here/env.sh"

why=$(node_unsupported)
if [ -n "$why" ]; then
  echo "node/build.sh: not building the real node, this machine cannot run it: $why" >&2
  exit 0
fi
command -v go >/dev/null || { echo "node/build.sh: Go is needed to build the kubelet" >&2; exit 1; }
command -v gcc >/dev/null || { echo "node/build.sh: gcc is needed to build pause" >&2; exit 1; }
cd "$here"
export GOFLAGS=-mod=readonly

if [ -f "$NODE_KUBELET/.complete" ]; then
  echo "kubelet $K8S_VERSION cached in $NODE_KUBELET" >&2
else
  mkdir -p "$NODE_KUBELET.partial"
  minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  ldflags="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
    ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
  done
  echo "building kubelet (k8s.io/kubernetes/cmd/kubelet $K8S_VERSION) ... (a cold build takes minutes; go is compiling, not hung)" >&2
  start=$(date +%s)
  ( while sleep 60; do echo "    ... still building kubelet ($(( $(date +%s) - start ))s)" >&2; done ) &
  ticker=$!
  if ! CGO_ENABLED=0 go build -p 2 -trimpath -ldflags "$ldflags" -o "$NODE_KUBELET.partial/kubelet" \
    k8s.io/kubernetes/cmd/kubelet; then
    kill "$ticker" 2>/dev/null
    echo "node/build.sh: building the kubelet failed" >&2
    exit 1
  fi
  kill "$ticker" 2>/dev/null; wait "$ticker" 2>/dev/null || true
  echo "    built kubelet in $(( $(date +%s) - start ))s" >&2
  touch "$NODE_KUBELET.partial/.complete"
  rm -rf "$NODE_KUBELET"
  mv "$NODE_KUBELET.partial" "$NODE_KUBELET"
fi

if [ -f "$NODE_IMAGES/.complete" ]; then
  echo "real-node images cached in $NODE_IMAGES" >&2
else
  rm -rf "$NODE_IMAGES.partial"
  mkdir -p "$NODE_IMAGES.partial/bin"
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$NODE_IMAGES.partial/bin/kvserver" ./kvserver
  k8s_dir=$(go list -m -f '{{.Dir}}' k8s.io/kubernetes)
  gcc -Os -static -DVERSION=3.10.1 -o "$NODE_IMAGES.partial/bin/pause" "$k8s_dir/build/pause/linux/pause.c"
  python3 "$here/images.py" "$NODE_IMAGES.partial/bin" "$NODE_IMAGES.partial" >/dev/null
  touch "$NODE_IMAGES.partial/.complete"
  rm -rf "$NODE_IMAGES"
  mv "$NODE_IMAGES.partial" "$NODE_IMAGES"
  echo "built the real-node images in $NODE_IMAGES" >&2
fi
