# linnet: `make demo` runs the main job on the local control plane; `make test` runs every test.
SHELL := bash
CARGO ?= cargo

.PHONY: all build test test-unit lint fmt crds demo cluster-build cluster-up cluster-down bench clean

all: build

build:
	$(CARGO) build --release

## test: build the control plane if its cache is missing, start it, run every test, stop it.
test: cluster-build
	$(CARGO) test --all-targets --no-run
	@mkdir -p target; \
	tests/cluster/with-cluster.sh $(CARGO) test --all-targets --no-fail-fast 2>&1 | tee target/test.log; \
	rc=$${PIPESTATUS[0]}; \
	awk '/^test result:/ { p += $$4; f += $$6 } END { printf "tests: %d passed, %d failed\n", p, f }' target/test.log; \
	exit $$rc

## test-unit: the quick loop, no cluster needed.
test-unit:
	$(CARGO) test --lib

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

## crds: regenerate deploy/crds/ from the Rust types (a test fails when they differ).
crds:
	$(CARGO) run --quiet -- crds > deploy/crds/crds.yaml

## demo: the main job on the local control plane (filled in as linnet grows).
demo: cluster-up
	$(CARGO) build --quiet
	@. tests/cluster/env.sh; export KUBECONFIG=$$CP_RUN/admin.kubeconfig; \
	echo; echo "\$$ linnet validate examples/gitops-repo"; \
	target/debug/linnet validate examples/gitops-repo; \
	echo; echo "\$$ linnet diff examples/gitops-repo   # what a sync would create"; \
	target/debug/linnet diff examples/gitops-repo | head -40 || true; \
	echo; \
	echo "The local control plane is running. Point kubectl at it:"; \
	echo "  export KUBECONFIG=$$CP_RUN/admin.kubeconfig"; \
	echo "  kubectl get nodes"; \
	echo "Stop it with: make cluster-down"

## bench: measurements, not pass/fail tests (idle poll cost; more in later issues).
bench:
	$(CARGO) bench --bench source

cluster-build:
	tests/cluster/build.sh >/dev/null

cluster-up:
	tests/cluster/up.sh

cluster-down:
	tests/cluster/down.sh

clean: cluster-down
	$(CARGO) clean
