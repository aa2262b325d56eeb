#!/usr/bin/env bash
# What `make test` and `make demo` need from the machine, checked and, on Debian or Ubuntu as
# root, installed: the Debian packages the build and the tests use (sshd for the SSH source's
# test, libssl-dev for libgit2's HTTPS, cmake for the zlib-ng it is built with, gnupg to sign
# commits in the verified-commits test, chromium for the dashboard's browser test, jq for tests/run.sh's list of
# test binaries, and so on).
# Not root: prints the one command to run.
# Go and Rust are checked, not installed (their distribution packages are often too old).
set -euo pipefail

need=()
for pkg_cmd in git:git openssl:openssl curl:curl python3:python3 make:make gcc:gcc \
  pkg-config:pkg-config ca-certificates:update-ca-certificates openssh-client:ssh-keygen \
  gnupg:gpg iproute2:ip jq:jq \
  cmake:cmake; do
  pkg=${pkg_cmd%%:*}; cmd=${pkg_cmd#*:}
  command -v "$cmd" >/dev/null 2>&1 || need+=("$pkg")
done
if command -v dpkg >/dev/null 2>&1; then
  dpkg -s libssl-dev >/dev/null 2>&1 || need+=(libssl-dev)
fi
# The Git source's SSH test runs a real sshd on 127.0.0.1.
[ -x /usr/sbin/sshd ] || [ -x /usr/bin/sshd ] || need+=(openssh-server)
# The dashboard's test drives a real headless browser: Debian's chromium.
command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || need+=(chromium)
# The real-node tier (tests/node/): containerd and runc run its pods, the CNI plugins give them
# a bridge network. Only Linux as root can run it; elsewhere its tests say why and pass.
if [ "$(uname -s)" = Linux ] && [ "$(id -u)" = 0 ]; then
  command -v containerd >/dev/null 2>&1 || need+=(containerd)
  command -v runc >/dev/null 2>&1 || need+=(runc)
  [ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
  command -v iptables >/dev/null 2>&1 || need+=(iptables)
fi

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

# The traffic tests send real requests through a real gateway to "pods": kwok gives pods
# addresses in 198.18.0.0/16 (the API server refuses loopback ones in EndpointSlices), and a
# local route makes that range this machine's own, so a test server can listen on each pod's
# address. The range is reserved for benchmarking (RFC 2544): no pod network (kind, flannel
# and kubeadm use 10.244.0.0/16), VPN or home network uses it, so the route breaks nothing.
# The route is read into a variable, not piped to `grep -q`: under pipefail, grep leaving at
# its first match can fail `ip` with SIGPIPE, and the second run then tried to add it again.
pod_route=$(ip route get 198.18.0.1 2>/dev/null || true)
if [[ "$pod_route" != local* ]]; then
  if [ "$(id -u)" = 0 ]; then
    echo "deps: routing the test pods' addresses (198.18.0.0/16) to this machine (lo)" >&2
    ip route replace local 198.18.0.0/16 dev lo
  else
    echo "deps: the traffic tests need the test pods' addresses on this machine. Run:" >&2
    echo "    sudo ip route add local 198.18.0.0/16 dev lo" >&2
    echo "then run make again (it lasts until the next reboot)." >&2
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

# A cold `make test` writes 15 to 30 GiB: measured, target/ 7.1 GiB (CARGO_INCREMENTAL=0, as
# CI builds; incremental builds add much more), Go's module cache 7.5 GiB, and Go's build
# cache up to 12 GiB while the tools build. A full disk fails tests far from the cause ("No space left on device" in
# whichever test wrote next), so say it here, where the fix is obvious.
free_kib=$(df -Pk . | awk 'NR == 2 { print $4 }')
if [ -n "$free_kib" ] && [ "$free_kib" -lt $((20 * 1024 * 1024)) ]; then
  echo "deps: only $((free_kib / 1024 / 1024)) GiB free here; a cold make test writes 15 to 30 GiB." >&2
  echo "      Free some (cargo clean in an old checkout, go clean -cache) if the build fails." >&2
fi
