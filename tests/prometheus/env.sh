# Shared settings for the test Prometheus. Sourced, not run.
LINNET_CACHE=${LINNET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/linnet}
_prom_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The cache key covers the pinned module set and this build, so a change rebuilds.
_prom_key=$( (cat "$_prom_here/go.mod" "$_prom_here/go.sum" "$_prom_here/build.sh") | sha256sum | cut -c1-12)
PROMETHEUS_BIN=$LINNET_CACHE/prometheus/$_prom_key/bin
