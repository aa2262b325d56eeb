# linnet: `make demo` runs the main job on the local control plane; `make test` runs every test.
SHELL := bash
CARGO ?= cargo

.PHONY: all build test test-unit lint fmt demo cluster-build cluster-up cluster-down bench clean

all: build

build:
	$(CARGO) build --release

## test: build the control plane if its cache is missing, start it, run every test, stop it.
test: cluster-build
	$(CARGO) test --all-targets --no-run
	tests/cluster/with-cluster.sh $(CARGO) test --all-targets

## test-unit: the quick loop, no cluster needed.
test-unit:
	$(CARGO) test --lib

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

## demo: the main job on the local control plane (filled in as linnet grows).
demo: cluster-up
	@. tests/cluster/env.sh; \
	echo; \
	echo "The local control plane is running. Point kubectl at it:"; \
	echo "  export KUBECONFIG=$$CP_RUN/admin.kubeconfig"; \
	echo "  kubectl get nodes"; \
	echo "Stop it with: make cluster-down"

cluster-build:
	tests/cluster/build.sh >/dev/null

cluster-up:
	tests/cluster/up.sh

cluster-down:
	tests/cluster/down.sh

clean: cluster-down
	$(CARGO) clean
