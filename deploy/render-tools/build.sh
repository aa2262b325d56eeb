#!/usr/bin/env bash
# Builds the renderers the agent runs on Kustomize overlays and Helm charts, kustomize and
# helm, from the Go modules pinned in go.mod, static (CGO off) so the same binaries go into
# the agent's image. Prints the bin directory on its last line. A warm cache builds nothing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=deploy/render-tools/env.sh
. "$here/env.sh"

if [ -f "$RENDER_BIN/.complete" ]; then
  echo "renderers cached in $RENDER_BIN" >&2
  echo "$RENDER_BIN"
  exit 0
fi
# Tests running in parallel may each ask for them: one builds, the others wait for it.
mkdir -p "$LINNET_CACHE/render"
exec 9>"$LINNET_CACHE/render/.lock"
flock 9
if [ -f "$RENDER_BIN/.complete" ]; then
  echo "$RENDER_BIN"
  exit 0
fi
command -v go >/dev/null || { echo "render-tools/build.sh: Go is needed to build kustomize and helm (https://go.dev/dl)" >&2; exit 1; }
cd "$here"
rm -rf "$RENDER_BIN.partial"
mkdir -p "$RENDER_BIN.partial"
export CGO_ENABLED=0 GOFLAGS=-mod=readonly
for t in "kustomize sigs.k8s.io/kustomize/kustomize/v5" "helm helm.sh/helm/v4/cmd/helm"; do
  name=${t%% *}; pkg=${t#* }
  echo "building $name ($pkg) ... (a cold build takes a few minutes; go is compiling, not hung)" >&2
  start=$(date +%s)
  go build -p 2 -trimpath -ldflags "-s -w" -o "$RENDER_BIN.partial/$name" "$pkg"
  echo "    built $name in $(( $(date +%s) - start ))s" >&2
done
touch "$RENDER_BIN.partial/.complete"
rm -rf "$RENDER_BIN"
mv "$RENDER_BIN.partial" "$RENDER_BIN"
echo "$RENDER_BIN"
