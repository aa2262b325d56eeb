# Shared settings for the test InfluxDB. Sourced, not run.
LINNET_CACHE=${LINNET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/linnet}
_influx_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The cache key covers the pinned module set and this build, so a change rebuilds.
_influx_key=$( (cat "$_influx_here/go.mod" "$_influx_here/go.sum" "$_influx_here/build.sh") | sha256sum | cut -c1-12)
INFLUXDB_BIN=$LINNET_CACHE/influxdb/$_influx_key/bin
