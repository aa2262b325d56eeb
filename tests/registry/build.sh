#!/usr/bin/env bash
# Builds crane and distribution's registry from the Go modules pinned in go.mod into a cache
# directory outside the checkout (`make image` uses crane; the image test also runs a
# registry). Prints the bin directory on its last line. A warm cache builds nothing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/registry/env.sh
. "$here/env.sh"

if [ -f "$REGISTRY_TOOLS_BIN/.complete" ]; then
  echo "image tools cached in $REGISTRY_TOOLS_BIN" >&2
  echo "$REGISTRY_TOOLS_BIN"
  exit 0
fi
mkdir -p "$LINNET_CACHE/registry"
exec 9>"$LINNET_CACHE/registry/.lock"
flock 9
if [ -f "$REGISTRY_TOOLS_BIN/.complete" ]; then
  echo "$REGISTRY_TOOLS_BIN"
  exit 0
fi
command -v go >/dev/null || { echo "registry/build.sh: Go is needed to build crane (https://go.dev/dl)" >&2; exit 1; }
cd "$here"
rm -rf "$REGISTRY_TOOLS_BIN.partial"
mkdir -p "$REGISTRY_TOOLS_BIN.partial"
export CGO_ENABLED=0 GOFLAGS=-mod=readonly
for t in "crane github.com/google/go-containerregistry/cmd/crane" \
  "registry github.com/distribution/distribution/v3/cmd/registry"; do
  name=${t%% *}; pkg=${t#* }
  echo "building $name ($pkg) ... (a cold build takes a minute or two; go is compiling, not hung)" >&2
  start=$(date +%s)
  go build -p 2 -trimpath -ldflags "-s -w" -o "$REGISTRY_TOOLS_BIN.partial/$name" "$pkg"
  echo "    built $name in $(( $(date +%s) - start ))s" >&2
done
touch "$REGISTRY_TOOLS_BIN.partial/.complete"
rm -rf "$REGISTRY_TOOLS_BIN"
mv "$REGISTRY_TOOLS_BIN.partial" "$REGISTRY_TOOLS_BIN"
echo "$REGISTRY_TOOLS_BIN"
