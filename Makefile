# linnet: `make demo` runs the main job on the local control plane; `make test` runs every test.
SHELL := bash
CARGO ?= cargo

PREFIX ?= $(HOME)/.cargo

.PHONY: all build install image image-push image-tools render-build gateway-build deps plan-test plan-demo test-tools test test-unit fuzz lint fmt crds demo demo-fleet cluster-build node-build node-up node-down gitea-build tools-build prometheus-build otel-build influxdb-build cluster-up cluster-down bench bench-large bench-sittings bench-shards chaos soak clean

all: build

build:
	$(CARGO) build --release

## image: linnet's container image as an OCI layout in $(IMAGE_DIR) (target/image), built without
## Docker: a static binary (glibc and OpenSSL linked in) on no base image, user 65532, labels
## with the version and the commit (deploy/image/build.py). IMAGE_PROFILE=dev for a quick one.
## image-push REGISTRY=registry.example.com/team pushes it as $(REGISTRY)/linnet:$(VERSION),
## with crane (built from its Go module, like the other tools). IMAGE_ARCHIVE=linnet.tar also
## writes it as one tar, named IMAGE_NAME, for `ctr images import` (the real-node install test).
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
COMMIT := $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
IMAGE_TARGET := x86_64-unknown-linux-gnu
IMAGE_PROFILE ?= release
IMAGE_DIR ?= target/image
image-tools:
	@tests/registry/build.sh >/dev/null

image: image-tools render-build
	LINNET_GIT_COMMIT=$(COMMIT) RUSTFLAGS="-C target-feature=+crt-static" OPENSSL_STATIC=1 \
	  $(CARGO) build --locked --profile $(IMAGE_PROFILE) --target $(IMAGE_TARGET) --bin linnet
	python3 deploy/image/build.py \
	  target/$(IMAGE_TARGET)/$(if $(filter dev,$(IMAGE_PROFILE)),debug,$(IMAGE_PROFILE))/linnet \
	  $(IMAGE_DIR) --version $(VERSION) --commit $(COMMIT) \
	  --tool "$$(deploy/render-tools/build.sh)/kustomize" --tool "$$(deploy/render-tools/build.sh)/helm" \
	  $(if $(IMAGE_NAME),--image-name $(IMAGE_NAME)) $(if $(IMAGE_ARCHIVE),--archive $(IMAGE_ARCHIVE))

image-push: image
	@[ -n "$(REGISTRY)" ] || { echo "make image-push REGISTRY=registry.example.com/team: where to push" >&2; exit 2; }
	"$$(tests/registry/build.sh)/crane" push $(IMAGE_DIR) $(REGISTRY)/linnet:$(VERSION)

## install: the CLI in $(PREFIX)/bin (default ~/.cargo/bin), also as `kubectl-linnet`, so that
## `kubectl linnet get` works; the renderers it runs (kustomize, helm) in $(PREFIX)/lib/linnet,
## where linnet finds them when PATH has none (never on PATH: they would shadow yours).
install: render-build
	$(CARGO) install --locked --path . --root $(PREFIX)
	ln -sf linnet $(PREFIX)/bin/kubectl-linnet
	mkdir -p $(PREFIX)/lib/linnet
	cp "$$(deploy/render-tools/build.sh)/kustomize" "$$(deploy/render-tools/build.sh)/helm" $(PREFIX)/lib/linnet/
	@echo "installed $(PREFIX)/bin/linnet and $(PREFIX)/bin/kubectl-linnet (kubectl linnet ...), and kustomize and helm in $(PREFIX)/lib/linnet"

## deps: check (and, as root on Debian or Ubuntu, install) what the machine needs.
deps:
	@tests/deps.sh

## plan-test, plan-demo: what a first run on this machine will build and about how long
## (tests/plan.sh), said before anything is built.
plan-test:
	@tests/plan.sh test

plan-demo:
	@tests/plan.sh demo

## test-tools: every tool the tests build from source (each cached), TOOL_JOBS at a time: each
## Go build uses two cores, so one at a time on two cores, more where there are more.
TOOL_JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); echo $$(( n / 2 > 0 ? n / 2 : 1 )))
test-tools:
	@$(MAKE) --no-print-directory -j$(TOOL_JOBS) cluster-build node-build gitea-build tools-build \
	  render-build gateway-build prometheus-build influxdb-build otel-build image-tools

## test: say what a first run builds (plan-test), install what the machine lacks (deps), build
## the tools whose caches are missing (test-tools: the control plane and the kubelet, Gitea,
## kubectl and kstatus, kustomize and helm, Traefik, Prometheus, InfluxDB, the OpenTelemetry Collector,
## crane and a registry), start the control plane, run every test (tests/run.sh: three test
## binaries at a time, LINNET_TEST_JOBS), stop it.
test: plan-test deps test-tools
	$(CARGO) test --all-targets --no-run
	CARGO=$(CARGO) tests/cluster/with-cluster.sh tests/run.sh

## test-unit: the quick loop, no cluster needed.
test-unit:
	$(CARGO) test --lib

## fuzz: the seeded fuzz targets of `make test` (tests/fuzz.rs), longer: FUZZ_CASES cases
## from FUZZ_SEED (a failure prints the seed and case that reproduce it).
FUZZ_CASES ?= 1000000
FUZZ_SEED ?= 1
fuzz:
	LINNET_FUZZ_CASES=$(FUZZ_CASES) LINNET_FUZZ_SEED=$(FUZZ_SEED) $(CARGO) test --release --test fuzz -- --nocapture

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

## crds: regenerate deploy/crds/ (and the Helm chart's copy) from the Rust types (a test fails
## when they differ).
crds:
	$(CARGO) run --quiet -- crds > deploy/crds/crds.yaml
	cp deploy/crds/crds.yaml deploy/helm/linnet/crds/crds.yaml

## demo: the main job on the local control plane: a Git repository with a push webhook, the
## agent, and the rollout story (see examples/demo.rs). Stops the control plane afterwards if
## it started it; exits non-zero if any step did not happen.
demo: plan-demo deps cluster-build node-build prometheus-build render-build gateway-build image-tools
	@echo "building linnet and the demo (the first time, a few minutes; cargo shows its progress)"
	$(CARGO) build --bin linnet --example demo
	@echo "\$$ linnet validate --check-namespaces never examples/gitops-repo"; \
	  LINNET_KUSTOMIZE="$$(deploy/render-tools/build.sh)/kustomize" LINNET_HELM="$$(deploy/render-tools/build.sh)/helm" \
	  target/debug/linnet validate --check-namespaces never examples/gitops-repo
	tests/cluster/with-cluster.sh bash -c 'KUBECONFIG=$$LINNET_CLUSTER_DIR/admin.kubeconfig target/debug/examples/demo'

## demo-fleet: a fleet of three clusters (the local control plane and two more) and one
## repository: a new image moves wave by wave, a manual wave waits for its approval in Git,
## and an image that fails in the first wave starts nowhere else (see examples/demo_fleet.rs).
demo-fleet: plan-demo deps cluster-build
	@echo "building linnet and the fleet demo (the first time, a few minutes; cargo shows its progress)"
	$(CARGO) build --bin linnet --example demo_fleet
	tests/cluster/with-cluster.sh bash -c 'KUBECONFIG=$$LINNET_CLUSTER_DIR/admin.kubeconfig target/debug/examples/demo_fleet'

## bench: measurements, not pass/fail tests: the idle poll's cost, then linnet at 10, 100 and
## 1,000 rollouts on the local control plane (push latency, idle CPU and writes, initial sync,
## step latency, memory, churn, CPU per push, writes per rollout in a first sync, start to
## children Ready, and the last two for the same StatefulSets created without linnet),
## written to bench/RESULTS.md; and a push to the spec set through Kustomize overlays against
## plain YAML at 100 and 1,000 apps (bench/RENDER.md); and traffic shifting at 100 rollouts
## with routes through a real Traefik: step to route updated, route to the split at the
## gateway (bench/TRAFFIC.md); and on the real node, push to a canary pod serving its
## replica's old data and abort to the stable pod serving again, with the CPU and memory of
## node, agent and control plane (bench/NODE.md); a fleet of three control planes
## (bench/FLEET.md); and image automation, a registry push to the canary's first Ready pod
## by webhook and by polling (bench/IMAGES.md). About 50 minutes.
bench: cluster-build node-build render-build gateway-build image-tools deps
	$(CARGO) bench --bench source
	LINNET_KUSTOMIZE="$$(deploy/render-tools/build.sh)/kustomize" tests/cluster/with-cluster.sh $(CARGO) bench --bench render
	tests/cluster/with-cluster.sh $(CARGO) bench --bench traffic
	tests/cluster/with-cluster.sh $(CARGO) bench --bench node
	tests/cluster/with-cluster.sh $(CARGO) bench --bench fleet
	tests/cluster/with-cluster.sh $(CARGO) bench --bench images
	tests/cluster/with-cluster.sh $(CARGO) bench --bench scale

## bench-large: the same measurements at 10,000 rollouts only (10,000 StatefulSets and pods on
## the local control plane), with a 60 s idle window and without the analysis load, then a
## first sync by three sharded replicas; writes bench/RESULTS-large.md. bench/RESULTS.md says
## how long it takes and what it found.
bench-large: cluster-build
	LINNET_BENCH_SIZES=$${LINNET_BENCH_SIZES:-10000} LINNET_BENCH_IDLE_SECS=$${LINNET_BENCH_IDLE_SECS:-60} \
	  LINNET_BENCH_SHARDS=$${LINNET_BENCH_SHARDS:-3} \
	  LINNET_BENCH_ANALYSIS=$${LINNET_BENCH_ANALYSIS:-0} LINNET_BENCH_RESULTS=$${LINNET_BENCH_RESULTS:-bench/RESULTS-large.md} \
	  tests/cluster/with-cluster.sh $(CARGO) bench --bench scale

## bench-sittings: the first sync against the floor alone (issue 77): three alternating
## sittings at 1,000 rollouts, linnet then the same sets created directly, with ten pushes in
## each linnet sitting (webhook -> revision read beside git fetch of the same push); writes its
## own section of bench/RESULTS.md. About 12 minutes. `make bench` measures the same.
bench-sittings: cluster-build
	LINNET_BENCH_ONLY=sittings LINNET_BENCH_SIZES=$${LINNET_BENCH_SIZES:-1000} \
	  tests/cluster/with-cluster.sh $(CARGO) bench --bench scale

## bench-shards: the first sync of 100,000 rollouts by 10 replicas (`--shards 10`) started
## together, per shard (issue 77): the syncing replica's source read and applies, each shard's
## stable sets created, its sampled rollouts Stable and its replica's peak memory. One rollout
## in 100 runs its pod (the others' pods are created, never scheduled). Keeps its namespace:
## run it on a cluster of its own (`tests/cluster/with-cluster.sh` takes it down after). Writes
## its own section of bench/RESULTS.md. About 45 minutes and 22 GB of memory on 2 cores.
bench-shards: cluster-build
	LINNET_BENCH_ONLY=shards LINNET_BENCH_SIZES=$${LINNET_BENCH_SIZES:-100000} \
	  LINNET_BENCH_SHARDS=$${LINNET_BENCH_SHARDS:-10} LINNET_BENCH_POD_SAMPLE=$${LINNET_BENCH_POD_SAMPLE:-100} \
	  LINNET_BENCH_FILES_PER_DIR=$${LINNET_BENCH_FILES_PER_DIR:-1000} LINNET_KEEP_NAMESPACES=1 \
	  tests/cluster/with-cluster.sh $(CARGO) bench --bench scale

## soak: every feature on at once for SOAK_SECS (an hour) on the real node, drift checks every
## 20 s, a push every 30 s (tests/soak.rs; `make test` runs it for 3 minutes); writes bench/SOAK.md.
SOAK_SECS ?= 3600
soak: deps cluster-build node-build gateway-build prometheus-build
	LINNET_SOAK_SECS=$(SOAK_SECS) LINNET_SOAK_DRIFT=20s LINNET_SOAK_REPORT=$(CURDIR)/bench/SOAK.md \
	  tests/cluster/with-cluster.sh $(CARGO) test --test soak -- --nocapture

## chaos: the chaos soak (200 random kills, a kube-apiserver restart, a Git outage); writes bench/CHAOS.md.
chaos: cluster-build
	tests/cluster/with-cluster.sh $(CARGO) bench --bench chaos

cluster-build:
	tests/cluster/build.sh >/dev/null

gitea-build:
	tests/gitea/build.sh >/dev/null

tools-build:
	tests/tools/build.sh >/dev/null

## render-build: kustomize and helm, the renderers the agent runs and its image ships, built
## from the Go modules pinned in deploy/render-tools/.
render-build:
	@echo "renderers in $$(deploy/render-tools/build.sh) (linnet looks on PATH, then beside itself where make install puts them)"

## gateway-build: Traefik (from its Go module) and the Gateway API CRDs, for the traffic tests;
## cached.
gateway-build:
	tests/gateway/build.sh >/dev/null

prometheus-build:
	tests/prometheus/build.sh >/dev/null

## influxdb-build: influxd (InfluxDB 1.8, from its Go module), the analysis tests' InfluxQL
## server; cached.
influxdb-build:
	tests/influxdb/build.sh >/dev/null

## otel-build: the OpenTelemetry Collector the trace tests export to (tests/otel/), cached.
otel-build:
	tests/otel/build.sh >/dev/null

cluster-up:
	tests/cluster/up.sh

## node-build: the real-node tier (tests/node/): the kubelet from the control plane's Go module,
## the tests' key-value server, pause, and their images; cached like the control plane.
node-build:
	tests/node/build.sh >/dev/null

## node-up: the real node beside a running control plane (`make cluster-up` first): containerd,
## runc, a bridge CNI and a kubelet, node linnet-node-0. node-down stops it.
node-up:
	tests/node/up.sh

node-down:
	tests/node/down.sh

cluster-down:
	tests/cluster/down.sh

clean: cluster-down
	$(CARGO) clean
