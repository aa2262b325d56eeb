#!/usr/bin/env bash
# What `make test` and `make demo` need from the machine, checked and, on Debian or Ubuntu as
# root, installed: the Debian packages the build and the tests use (sshd for the SSH source's
# test, libssl-dev for libgit2's HTTPS, cmake for the zlib-ng it is built with, gnupg to sign
# commits in the verified-commits test, and so on).
# Not root: prints the one command to run.
# Go and Rust are checked, not installed (their distribution packages are often too old).
set -euo pipefail

need=()
for pkg_cmd in git:git openssl:openssl curl:curl python3:python3 make:make gcc:gcc \
  pkg-config:pkg-config ca-certificates:update-ca-certificates openssh-client:ssh-keygen \
  gnupg:gpg \
  cmake:cmake; do
  pkg=${pkg_cmd%%:*}; cmd=${pkg_cmd#*:}
  command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg")
done
if command -v dpkg >/dev/null 2>&1; then
  dpkg -s libssl-dev >/dev/null 2>&1 || need+=(libssl-dev)
fi
# The Git source's SSH test runs a real sshd on 127.0.0.1.
[ -x /usr/sbin/sshd ] || [ -x /usr/bin/sshd ] || need+=(openssh-server)

if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "deps: installing ${need[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}"
  else
    echo "deps: this machine lacks ${need[*]}. On Debian or Ubuntu, run:" >&2
    echo "    sudo apt-get install -y --no-install-recommends ${need[*]}" >&2
    echo "then run make again (other systems: install the same tools)." >&2
    exit 1
  fi
fi

command -v go >/dev/null 2>&1 || {
  echo "deps: Go 1.26 or newer is needed to build the control plane and Gitea: https://go.dev/dl" >&2
  exit 1
}
command -v cargo >/dev/null 2>&1 || {
  echo "deps: Rust (cargo) is needed: https://rustup.rs" >&2
  exit 1
}
