# Shared settings for the Gitea build. Sourced, not run.
GITEA_VERSION=v1.26.0
LINNET_CACHE=${LINNET_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/linnet}
_gitea_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# Bump GITEA_BUILD_REV when build.sh changes what it produces.
GITEA_BUILD_REV=1
_gitea_key=$( (cat "$_gitea_here/go.mod" "$_gitea_here/go.sum"; echo "$GITEA_BUILD_REV") | sha256sum | cut -c1-12)
# Holds bin/gitea and the templates/ and options/ Gitea reads at start (no bindata build).
GITEA_HOME=$LINNET_CACHE/gitea/$GITEA_VERSION-$_gitea_key
