#!/usr/bin/env bash
# Builds the test tools from the Go modules pinned in go.mod into a cache directory outside
# the checkout: kubectl (the install test runs the commands of docs/getting-started.md with
# it) and kstatus (the
# conditions test asks it how Flux reads each phase). Prints the bin directory on its last
# line. A warm cache builds nothing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/tools/env.sh
. "$here/env.sh"

if [ -f "$TOOLS_BIN/.complete" ]; then
  echo "test tools cached in $TOOLS_BIN" >&2
  echo "$TOOLS_BIN"
  exit 0
fi
# Tests running in parallel may each ask for the tools: one builds, the others wait for it.
mkdir -p "$LINNET_CACHE/tools"
exec 9>"$LINNET_CACHE/tools/.lock"
flock 9
if [ -f "$TOOLS_BIN/.complete" ]; then
  echo "$TOOLS_BIN"
  exit 0
fi
command -v go >/dev/null || { echo "tools/build.sh: Go is needed to build kubectl and kstatus (https://go.dev/dl)" >&2; exit 1; }
cd "$here"
rm -rf "$TOOLS_BIN.partial"
mkdir -p "$TOOLS_BIN.partial"
export CGO_ENABLED=0 GOFLAGS=-mod=readonly
for t in "kstatus ./cmd/kstatus" "kubectl ./cmd/kubectl"; do
  name=${t%% *}; pkg=${t#* }
  echo "building $name ($pkg) ... (a cold build takes a few minutes; go is compiling, not hung)" >&2
  start=$(date +%s)
  go build -p 2 -trimpath -ldflags "-s -w" -o "$TOOLS_BIN.partial/$name" "$pkg"
  echo "    built $name in $(( $(date +%s) - start ))s" >&2
done
touch "$TOOLS_BIN.partial/.complete"
rm -rf "$TOOLS_BIN"
mv "$TOOLS_BIN.partial" "$TOOLS_BIN"
echo "$TOOLS_BIN"
