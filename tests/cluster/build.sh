#!/usr/bin/env bash
# Builds the local control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kwok) from the Go modules pinned in go.mod, one binary at a time, into a cache directory
# outside the checkout. Prints the bin directory on its last line. A warm cache builds nothing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/cluster/env.sh
. "$here/env.sh"

if [ -f "$CP_BIN/.complete" ]; then
  echo "control plane $K8S_VERSION cached in $CP_BIN" >&2
  echo "$CP_BIN"
  exit 0
fi

command -v go >/dev/null || { echo "build.sh: Go is needed to build the control plane (https://go.dev/dl)" >&2; exit 1; }
mkdir -p "$CP_BIN.partial"
cd "$here"

minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
vpkgs="k8s.io/component-base/version k8s.io/client-go/pkg/version"
ldflags="-s -w"
for p in $vpkgs; do
  ldflags+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor"
  ldflags+=" -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
done

export CGO_ENABLED=0 GOFLAGS=-mod=readonly
targets=(
  "etcd ./cmd/etcd"
  "kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver"
  "kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager"
  "kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler"
  "kwok sigs.k8s.io/kwok/cmd/kwok"
)
i=0
for t in "${targets[@]}"; do
  i=$((i + 1))
  name=${t%% *}; pkg=${t#* }
  if [ -x "$CP_BIN.partial/$name" ]; then continue; fi
  echo "[$i/${#targets[@]}] building $name ($pkg) ... (a cold build takes minutes; go is compiling, not hung)" >&2
  start=$(date +%s)
  # -p 2 keeps memory bounded on small machines; progress is printed once a minute.
  ( while sleep 60; do echo "    ... still building $name ($(( $(date +%s) - start ))s)" >&2; done ) &
  ticker=$!
  if ! go build -p 2 -trimpath -ldflags "$ldflags" -o "$CP_BIN.partial/$name" "$pkg"; then
    kill "$ticker" 2>/dev/null
    echo "build.sh: building $name failed" >&2
    exit 1
  fi
  kill "$ticker" 2>/dev/null; wait "$ticker" 2>/dev/null || true
  echo "    built $name in $(( $(date +%s) - start ))s" >&2
done
# kwok ships its stock Stages in its module; up.sh builds its own stage set from them.
kwok_dir=$(go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)
mkdir -p "$CP_BIN.partial/kwok-stages"
for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
  pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml; do
  install -m 0644 "$kwok_dir/kustomize/stage/$f" "$CP_BIN.partial/kwok-stages/"
done
touch "$CP_BIN.partial/.complete"
rm -rf "$CP_BIN"
mv "$CP_BIN.partial" "$CP_BIN"
du -sh "$CP_BIN" >&2
echo "$CP_BIN"
