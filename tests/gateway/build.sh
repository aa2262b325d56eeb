#!/usr/bin/env bash
# Builds the Gateway API implementation the traffic tests send real requests through,
# Traefik, from the module pinned in go.mod, and copies the Gateway API CRDs (standard channel)
# of the gateway-api version it is built with next to it. Prints the directory on its last
# line: traefik, and crds/*.yaml. A warm cache builds nothing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/gateway/env.sh
. "$here/env.sh"

if [ -f "$GATEWAY_DIR/.complete" ]; then
  echo "gateway cached in $GATEWAY_DIR" >&2
  echo "$GATEWAY_DIR"
  exit 0
fi
# Tests running in parallel may each ask for it: one builds, the others wait for it.
mkdir -p "$LINNET_CACHE/gateway"
exec 9>"$LINNET_CACHE/gateway/.lock"
flock 9
if [ -f "$GATEWAY_DIR/.complete" ]; then
  echo "$GATEWAY_DIR"
  exit 0
fi
command -v go >/dev/null || { echo "gateway/build.sh: Go is needed to build Traefik (https://go.dev/dl)" >&2; exit 1; }
cd "$here"
rm -rf "$GATEWAY_DIR.partial"
mkdir -p "$GATEWAY_DIR.partial/crds"
export CGO_ENABLED=0 GOFLAGS=-mod=readonly
echo "building traefik (github.com/traefik/traefik/v3) ... (a cold build takes about 5 minutes; go is compiling, not hung)" >&2
start=$(date +%s)
go build -p 2 -trimpath -ldflags "-s -w" -o "$GATEWAY_DIR.partial/traefik" github.com/traefik/traefik/v3/cmd/traefik
echo "    built traefik in $(( $(date +%s) - start ))s" >&2
crds=$(go list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api)/config/crd/standard
cp "$crds"/*.yaml "$GATEWAY_DIR.partial/crds/"
touch "$GATEWAY_DIR.partial/.complete"
rm -rf "$GATEWAY_DIR"
mv "$GATEWAY_DIR.partial" "$GATEWAY_DIR"
echo "$GATEWAY_DIR"
