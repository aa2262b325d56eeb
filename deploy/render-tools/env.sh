# Shared settings for the renderers (kustomize, helm). Sourced, not run.
LINNET_CACHE=${LINNET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/linnet}
_render_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# The cache key covers the pinned module set and the script, so a change rebuilds.
_render_key=$( (cat "$_render_here/go.mod" "$_render_here/go.sum" "$_render_here/build.sh") | sha256sum | cut -c1-12)
RENDER_BIN=$LINNET_CACHE/render/$_render_key/bin
