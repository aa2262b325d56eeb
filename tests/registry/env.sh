# Shared settings for the image tools (crane, registry). Sourced, not run.
LINNET_CACHE=${LINNET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/linnet}
_registry_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The cache key covers the pinned module set and this build, so a change rebuilds.
_registry_key=$( (cat "$_registry_here/go.mod" "$_registry_here/go.sum" "$_registry_here/build.sh") | sha256sum | cut -c1-12)
REGISTRY_TOOLS_BIN=$LINNET_CACHE/registry/$_registry_key/bin
