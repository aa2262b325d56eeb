# Shared settings for the gateway the traffic tests use (Traefik). Sourced, not run.
LINNET_CACHE=${LINNET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/linnet}
_gw_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The cache key covers the pinned module set and the script, so a change rebuilds.
_gw_key=$( (cat "$_gw_here/go.mod" "$_gw_here/go.sum" "$_gw_here/build.sh") | sha256sum | cut -c1-12)
GATEWAY_DIR=$LINNET_CACHE/gateway/$_gw_key
