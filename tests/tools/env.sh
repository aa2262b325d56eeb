# Shared settings for the test tools (kubectl, kstatus). Sourced, not run.
LINNET_CACHE=${LINNET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/linnet}
_tools_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The cache key covers the pinned module set and the sources, so a change rebuilds.
_tools_key=$( (cat "$_tools_here/go.mod" "$_tools_here/go.sum" "$_tools_here/build.sh" "$_tools_here"/cmd/*/*.go) | sha256sum | cut -c1-12)
TOOLS_BIN=$LINNET_CACHE/tools/$_tools_key/bin
