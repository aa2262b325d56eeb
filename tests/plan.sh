#!/usr/bin/env bash
# Says, before anything is built, what `make test` (or `make demo`, `make soak`) will build on
# this machine and roughly how long each part takes: every tool built from source whose cache
# is missing, linnet's Rust build, then the tests. The minutes are those of a cold run on 2
# cores (bench/RESULTS.md, "A cold make test"), scaled by the cores this machine has for the
# parts that use them all. A warm machine prints one line.
#
#   tests/plan.sh [test|demo]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
goal=${1:-test}
cores=$(nproc 2>/dev/null || echo 2)

# Each tool's cache directory and its `.complete` marker, as its build.sh finds them.
# shellcheck source=tests/cluster/env.sh
. "$root/tests/cluster/env.sh"
# shellcheck source=tests/node/env.sh
. "$root/tests/node/env.sh"
# shellcheck source=tests/gitea/env.sh
. "$root/tests/gitea/env.sh"
# shellcheck source=tests/tools/env.sh
. "$root/tests/tools/env.sh"
# shellcheck source=deploy/render-tools/env.sh
. "$root/deploy/render-tools/env.sh"
# shellcheck source=tests/gateway/env.sh
. "$root/tests/gateway/env.sh"
# shellcheck source=tests/prometheus/env.sh
. "$root/tests/prometheus/env.sh"
# shellcheck source=tests/influxdb/env.sh
. "$root/tests/influxdb/env.sh"
# shellcheck source=tests/otel/env.sh
. "$root/tests/otel/env.sh"
# shellcheck source=tests/registry/env.sh
. "$root/tests/registry/env.sh"

# name|marker|minutes on 2 cores|goals that build it
parts=(
  "the control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok)|$CP_BIN/.complete|8|test demo"
  "the kubelet and the real node's images|$NODE_KUBELET/.complete|4|test demo"
  "Gitea (the real Git host of the Gitea tests)|$GITEA_HOME/.complete|5|test"
  "kubectl and kstatus|$TOOLS_BIN/.complete|2|test"
  "kustomize and helm|$RENDER_BIN/.complete|2|test demo"
  "Traefik (the gateway of the traffic tests)|$GATEWAY_DIR/.complete|8|test demo"
  "Prometheus (the analysis and monitoring tests)|$PROMETHEUS_BIN/.complete|7|test demo"
  "InfluxDB (the analysis tests' InfluxQL provider)|$INFLUXDB_BIN/.complete|1|test"
  "the OpenTelemetry Collector (the trace tests)|$OTELCOL_BIN/.complete|1|test"
  "crane and a registry (the image tests)|$REGISTRY_TOOLS_BIN/.complete|1|test"
)

todo=()
total=0
for part in "${parts[@]}"; do
  IFS='|' read -r name marker minutes goals <<<"$part"
  case " $goals " in *" $goal "*) ;; *) continue ;; esac
  [ -f "$marker" ] && continue
  todo+=("$name, about $minutes min")
  total=$((total + minutes))
done
# linnet's own build: every test binary, from the crates in Cargo.lock.
if ! compgen -G "${CARGO_TARGET_DIR:-$root/target}/debug/deps/linnet-*" >/dev/null; then
  rust=18
  [ "$goal" = demo ] && rust=6
  todo+=("linnet and its test binaries (Rust; cargo shows its progress), about $rust min")
  total=$((total + rust))
fi
# More cores: the Go and Rust builds use them all (not the tests, which mostly wait).
scaled=$(( (total * 2 + cores - 1) / cores ))

if [ "${#todo[@]}" -eq 0 ]; then
  echo "plan: every tool is cached; the $goal starts now" >&2
  exit 0
fi
things="${#todo[@]} things"
[ "${#todo[@]}" -eq 1 ] && things="1 thing"
echo "plan: a first run on this machine: $things to build first, about $scaled min on $cores cores, then the $goal:" >&2
i=0
for t in "${todo[@]}"; do
  i=$((i + 1))
  echo "  $i. $t" >&2
done
if [ "$goal" = test ]; then
  echo "  then the tests, about 23 min (three test binaries at a time: they mostly wait for the control plane, the node and Git)." >&2
fi
echo "  Each build is cached (in ${LINNET_CACHE}), so the next run starts with the $goal." >&2
