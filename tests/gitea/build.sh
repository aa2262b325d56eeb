#!/usr/bin/env bash
# Builds Gitea from the Go module pinned in go.mod (SQLite, cgo), into a cache directory
# outside the checkout, with the templates/ and options/ it reads at start. Prints that
# directory on its last line. A warm cache builds nothing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=tests/gitea/env.sh
. "$here/env.sh"

if [ -f "$GITEA_HOME/.complete" ]; then
  echo "gitea $GITEA_VERSION cached in $GITEA_HOME" >&2
  echo "$GITEA_HOME"
  exit 0
fi
command -v go >/dev/null || { echo "gitea/build.sh: Go is needed to build Gitea (https://go.dev/dl)" >&2; exit 1; }
command -v gcc >/dev/null || { echo "gitea/build.sh: gcc is needed (Gitea's SQLite driver uses cgo)" >&2; exit 1; }
cd "$here"
rm -rf "$GITEA_HOME.partial"
mkdir -p "$GITEA_HOME.partial/bin"
echo "building gitea $GITEA_VERSION ... (a cold build takes several minutes; go is compiling, not hung)" >&2
start=$(date +%s)
( while sleep 60; do echo "    ... still building gitea ($(( $(date +%s) - start ))s)" >&2; done ) &
ticker=$!
trap 'kill $ticker 2>/dev/null || true' EXIT
export CGO_ENABLED=1 GOFLAGS=-mod=readonly
go build -p 2 -trimpath -tags 'sqlite sqlite_unlock_notify' \
  -ldflags "-s -w -X main.Version=${GITEA_VERSION#v} -X 'main.Tags=sqlite sqlite_unlock_notify'" \
  -o "$GITEA_HOME.partial/bin/gitea" code.gitea.io/gitea
echo "    built gitea in $(( $(date +%s) - start ))s" >&2
# Without the bindata tag Gitea reads these from its static root at start.
src=$(go list -m -f '{{.Dir}}' code.gitea.io/gitea)
cp -r "$src/templates" "$src/options" "$GITEA_HOME.partial/"
chmod -R u+w "$GITEA_HOME.partial"
touch "$GITEA_HOME.partial/.complete"
rm -rf "$GITEA_HOME"
mv "$GITEA_HOME.partial" "$GITEA_HOME"
echo "$GITEA_HOME"
