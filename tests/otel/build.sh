#!/usr/bin/env bash
# Builds the OpenTelemetry Collector the trace tests send linnet's spans to (main.go: the
# collector's OTLP receiver and OTLP/HTTP exporter, from the Go modules pinned in go.mod) into
# a cache directory outside the checkout. Prints the bin directory on its last line. A warm
# cache builds nothing; a cold build takes about 2 minutes on 2 cores.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/otel/env.sh
. "$here/env.sh"

if [ -f "$OTELCOL_BIN/.complete" ]; then
  echo "otelcol cached in $OTELCOL_BIN" >&2
  echo "$OTELCOL_BIN"
  exit 0
fi
# Tests running in parallel may each ask for it: one builds, the others wait.
mkdir -p "$LINNET_CACHE/otelcol"
exec 9>"$LINNET_CACHE/otelcol/.lock"
flock 9
if [ -f "$OTELCOL_BIN/.complete" ]; then
  echo "$OTELCOL_BIN"
  exit 0
fi
command -v go >/dev/null || { echo "otel/build.sh: Go is needed to build the collector (https://go.dev/dl)" >&2; exit 1; }
cd "$here"
rm -rf "$OTELCOL_BIN.partial"
mkdir -p "$OTELCOL_BIN.partial"
export CGO_ENABLED=0 GOFLAGS=-mod=readonly
echo "building the OpenTelemetry Collector ... (a cold build takes about 2 minutes)" >&2
start=$(date +%s)
go build -p 2 -trimpath -ldflags "-s -w" -o "$OTELCOL_BIN.partial/otelcol" .
echo "    built otelcol in $(( $(date +%s) - start ))s" >&2
touch "$OTELCOL_BIN.partial/.complete"
rm -rf "$OTELCOL_BIN"
mv "$OTELCOL_BIN.partial" "$OTELCOL_BIN"
echo "$OTELCOL_BIN"
