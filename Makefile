# RukPak in Python. `make test` and `make run` set everything up on a fresh machine.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
GRPC_TOOLS := $(PY) -m grpc_tools.protoc
PROTOS := csi/proto/csi.proto csi/proto/pluginregistration.proto
PYTEST_ARGS ?=

.PHONY: setup test lint typecheck proto proto-check run bench image manifests clean helm helm-image cosign kind kind-run kind-down docs promtool

setup:
	@bash hack/setup.sh

## proto: regenerate the Python gRPC stubs from csi/proto/*.proto
proto: setup
	$(GRPC_TOOLS) -I . --python_out=. --pyi_out=. --grpc_python_out=. $(PROTOS)

## proto-check: fail if the committed stubs differ from what `make proto` makes
proto-check: setup
	@bash hack/proto-check.sh $(PY) $(PROTOS)

lint: setup
	$(VENV)/bin/ruff check rukpak csi provisioner tests contrib
	$(VENV)/bin/ruff format --check rukpak csi provisioner tests contrib
	PYTHONPATH=contrib/helm-provisioner $(VENV)/bin/lint-imports --no-cache

typecheck: setup
	$(VENV)/bin/mypy rukpak csi provisioner tests contrib/helm-provisioner/rukpak_helm

## test: the whole suite (lint, types, proto drift, unit and integration tests), then the
## multi-node tests, then the kind tests. The first part is two pytest runs side by side:
## the tests of the local cluster (marker `cluster`, mostly waiting on the kubelet and the
## API server) in the foreground, the others in the background (their output follows the
## first run's); then the multi-node and kind runs, one cluster at a time. SERIAL=1 runs
## the first part as one run. With PYTEST_ARGS, one run with exactly those arguments.
SERIAL ?=
test: setup proto-check lint typecheck k8s-bins helm cosign kind promtool
	@check() { rc=$$1; shift; \
	  if [ $$rc -eq 5 ]; then echo "make test: pytest $$* collected no tests (exit 5): that is a failure, not a pass" >&2; fi; \
	  return $$rc; }; \
	first() { \
	  if [ -n '$(SERIAL)' ]; then \
	    $(PY) -m pytest -m 'not multinode and not kind'; check $$? -m 'not multinode and not kind'; return; \
	  fi; \
	  log=$$(mktemp "$${TMPDIR:-/tmp}/rukpak-make-test.XXXXXX"); \
	  $(PY) -m pytest -o cache_dir=.pytest_cache/unit -m 'not cluster and not multinode and not kind' \
	    >"$$log" 2>&1 & unit=$$!; \
	  trap 'kill $$unit 2>/dev/null' INT TERM; \
	  $(PY) -m pytest -m 'cluster and not multinode and not kind'; a=$$?; \
	  wait $$unit; b=$$?; \
	  echo "==== make test: the tests outside the local cluster, run beside it ===="; \
	  cat "$$log"; rm -f "$$log"; \
	  check $$a -m 'cluster and not multinode and not kind' && check $$b -m 'not cluster and not multinode and not kind'; }; \
	if [ -n '$(strip $(PYTEST_ARGS))' ]; then \
	  $(PY) -m pytest $(PYTEST_ARGS); check $$? $(PYTEST_ARGS); \
	else \
	  first \
	  && { $(PY) -m pytest -m multinode; check $$? -m multinode; } \
	  && { $(PY) -m pytest -m kind; check $$? -m kind; }; \
	fi

## run: the project's main job on a local cluster: install RukPak from deploy/, then a
## BundleDeployment's life (install, drift, pivot, bad image, delete), each step timed
## (run.sh runs `make setup`'s script itself, with Kubernetes building beside it)
run:
	@bash hack/run.sh

## kind: build the kind CLI (sigs.k8s.io/kind, hack/gotool.sh; cached)
kind:
	@bash hack/gotool.sh kind --quiet

## kind-run: the same as `make run` on a kind cluster (created, or reused; KIND_CLUSTER=name
## uses an existing one): the Docker engine from Debian, kind from its Go module and a node
## image built here (tests/kind); the cluster stays up for `make kind-down`
kind-run: setup k8s-bins
	@CLUSTER=kind bash hack/run.sh

## kind-down: delete the kind cluster and its registries, stop a dockerd kind-run started
kind-down: setup
	@$(PY) -m tests.kind down

## image: build the project's container image (no container engine) and push it to IMAGE;
## it runs every component (node plugin, manager, instance and unpack pods)
IMAGE ?=
image: setup
	@test -n "$(IMAGE)" || { echo "usage: make image IMAGE=registry.example.com/rukpak-python:TAG" >&2; exit 2; }
	bash hack/image/build.sh $(IMAGE)

## manifests: render deploy/ (the whole install) into one file, dist/rukpak.yaml, for releases;
## IMAGE=REF sets the image (the one `images:` entry), e.g. what `make image` pushed
manifests: setup k8s-bins
	@bash hack/manifests.sh $(if $(IMAGE),--image $(IMAGE))

## release: VERSION=x.y.z: everything a release ships, into dist/ (hack/release/release.sh),
## offline and with no container engine: the image for ARCHES (amd64 arm64) as one OCI index
## (an OCI layout archive; hack/release/push.sh pushes and signs it), rukpak.yaml and the Helm
## chart pinning it by digest, the CLI's wheel and sdist, an SPDX SBOM and SHA256SUMS.
## IMAGE_REPO names where the image will live (docs/install.md, "Releases")
.PHONY: release
VERSION ?=
release: setup
	@test -n "$(VERSION)" || { echo "usage: make release VERSION=x.y.z [ARCHES='amd64 arm64'] [IMAGE_REPO=...]" >&2; exit 2; }
	bash hack/release/release.sh $(VERSION)

## helm: build the helm binary (helm.sh/helm/v3, hack/helm.sh) the helm provisioner runs (cached)
helm:
	@bash hack/helm.sh --quiet

## cosign: build cosign 2 and 3 (github.com/sigstore/cosign/v2 and /v3, hack/gotool.sh), which
## the signature tests sign and verify with (cached)
cosign:
	@bash hack/gotool.sh cosign --quiet
	@bash hack/gotool.sh cosign3 --quiet
	@bash hack/gotool.sh tsa --quiet

## helm-image: the helm provisioner's image (contrib/helm-provisioner): RukPak's image plus helm
## and its package, pushed to IMAGE; deploy with `kubectl apply -k contrib/helm-provisioner/manifests`
helm-image: setup
	@test -n "$(IMAGE)" || { echo "usage: make helm-image IMAGE=registry.example.com/rukpak-helm-provisioner:TAG" >&2; exit 2; }
	bash contrib/helm-provisioner/hack/build-image.sh $(IMAGE)

## promtool: build Prometheus's promtool (github.com/prometheus/prometheus, hack/gotool.sh;
## cached), which checks and unit-tests the monitoring component's alerting rules
## (tests/test_monitoring_rules.py: `promtool check rules`, `promtool test rules`)
promtool:
	@bash hack/gotool.sh promtool --quiet

bench: setup
	$(PY) -m tests.bench

## docs: regenerate docs/reference/ from the code: the API reference from provisioner/crds/,
## the CLI reference from --help (hack/gendocs.py; tests/test_docs.py fails when they are stale)
docs: setup
	$(PY) hack/gendocs.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build *.egg-info

-include tests/cluster/cluster.mk
