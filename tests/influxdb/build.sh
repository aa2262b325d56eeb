#!/usr/bin/env bash
# Builds influxd (InfluxDB 1.8, the time-series database the analysis tests query by
# InfluxQL) from the Go module pinned in go.mod into a cache directory outside the checkout.
# Prints the bin directory on its last line. A warm cache builds nothing; a cold build takes
# about a minute on 2 cores. 1.8 is the last InfluxDB whose server builds without cgo (its
# Flux engine is pure Go; 1.9 and later need Rust's libflux).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/influxdb/env.sh
. "$here/env.sh"

if [ -f "$INFLUXDB_BIN/.complete" ]; then
  echo "influxdb cached in $INFLUXDB_BIN" >&2
  echo "$INFLUXDB_BIN"
  exit 0
fi
# Tests running in parallel may each ask for it: one builds, the others wait.
mkdir -p "$LINNET_CACHE/influxdb"
exec 9>"$LINNET_CACHE/influxdb/.lock"
flock 9
if [ -f "$INFLUXDB_BIN/.complete" ]; then
  echo "$INFLUXDB_BIN"
  exit 0
fi
command -v go >/dev/null || { echo "influxdb/build.sh: Go is needed to build InfluxDB (https://go.dev/dl)" >&2; exit 1; }
cd "$here"
rm -rf "$INFLUXDB_BIN.partial"
mkdir -p "$INFLUXDB_BIN.partial"
export CGO_ENABLED=0 GOFLAGS=-mod=readonly
echo "building influxd ... (a cold build takes about a minute; go is compiling, not hung)" >&2
start=$(date +%s)
go build -p 2 -trimpath -ldflags "-s -w" -o "$INFLUXDB_BIN.partial/influxd" \
  github.com/influxdata/influxdb/cmd/influxd
echo "    built influxd in $(( $(date +%s) - start ))s" >&2
touch "$INFLUXDB_BIN.partial/.complete"
rm -rf "$INFLUXDB_BIN"
mv "$INFLUXDB_BIN.partial" "$INFLUXDB_BIN"
echo "$INFLUXDB_BIN"
