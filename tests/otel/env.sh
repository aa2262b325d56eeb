# Shared settings for the test OpenTelemetry Collector. Sourced, not run.
LINNET_CACHE=${LINNET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/linnet}
_otel_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The cache key covers the pinned module set, the program and this build, so a change rebuilds.
_otel_key=$( (cat "$_otel_here/go.mod" "$_otel_here/go.sum" "$_otel_here/main.go" "$_otel_here/build.sh") | sha256sum | cut -c1-12)
OTELCOL_BIN=$LINNET_CACHE/otelcol/$_otel_key/bin
