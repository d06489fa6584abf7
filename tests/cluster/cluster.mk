# Local Kubernetes for tests and `make run` (tests/cluster). Included by the Makefile.
.PHONY: k8s-bins cluster-up cluster-down cluster-status test-cluster

## k8s-bins: build etcd, kube-* , kubelet, kubectl, csi-sanity from upstream (cached)
k8s-bins:
	@bash tests/cluster/build.sh

## cluster-up: start the cluster detached; prints `export KUBECONFIG=...`. NODES=3 starts
## three nodes, each in its own network and mount namespaces, with kube-proxy and CoreDNS
NODES ?= 1
cluster-up: setup k8s-bins
	@$(PY) -m tests.cluster up --nodes $(NODES)

## cluster-down: stop the cluster cluster-up started (by its recorded pids)
cluster-down:
	@$(PY) -m tests.cluster down

cluster-status:
	@$(PY) -m tests.cluster status

## test-cluster: the cluster's own tests
test-cluster: setup k8s-bins
	$(PY) -m pytest -p tests.cluster.fixture tests/test_cluster.py $(PYTEST_ARGS)
