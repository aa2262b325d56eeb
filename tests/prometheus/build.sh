#!/usr/bin/env bash
# Builds Prometheus (the server the analysis and monitoring tests query) and promtool (which
# checks deploy/monitoring's alert rules) from the Go module pinned in go.mod into a cache
# directory outside the checkout. Prints the bin directory on its last line. A
# warm cache builds nothing; a cold build takes about 5 minutes on 2 cores.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/prometheus/env.sh
. "$here/env.sh"

if [ -f "$PROMETHEUS_BIN/.complete" ]; then
  echo "prometheus cached in $PROMETHEUS_BIN" >&2
  echo "$PROMETHEUS_BIN"
  exit 0
fi
# Tests running in parallel may each ask for it: one builds, the others wait.
mkdir -p "$LINNET_CACHE/prometheus"
exec 9>"$LINNET_CACHE/prometheus/.lock"
flock 9
if [ -f "$PROMETHEUS_BIN/.complete" ]; then
  echo "$PROMETHEUS_BIN"
  exit 0
fi
command -v go >/dev/null || { echo "prometheus/build.sh: Go is needed to build Prometheus (https://go.dev/dl)" >&2; exit 1; }
cd "$here"
rm -rf "$PROMETHEUS_BIN.partial"
mkdir -p "$PROMETHEUS_BIN.partial"
export CGO_ENABLED=0 GOFLAGS=-mod=readonly
echo "building prometheus ... (a cold build takes about 5 minutes; go is compiling, not hung)" >&2
start=$(date +%s)
# Without the builtinassets tag the web UI is left out; the tests use only the HTTP API.
go build -p 2 -trimpath -ldflags "-s -w" -o "$PROMETHEUS_BIN.partial/prometheus" \
  github.com/prometheus/prometheus/cmd/prometheus
go build -p 2 -trimpath -ldflags "-s -w" -o "$PROMETHEUS_BIN.partial/promtool" \
  github.com/prometheus/prometheus/cmd/promtool
echo "    built prometheus and promtool in $(( $(date +%s) - start ))s" >&2
touch "$PROMETHEUS_BIN.partial/.complete"
rm -rf "$PROMETHEUS_BIN"
mv "$PROMETHEUS_BIN.partial" "$PROMETHEUS_BIN"
echo "$PROMETHEUS_BIN"
