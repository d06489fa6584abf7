"""Shared pytest configuration.

Heavy real components are session fixtures provided by plugin modules:
``tests.registry`` (Debian's docker-registry, plain, htpasswd and token auth),
``tests.cluster.fixture`` (etcd + kube-apiserver, and the full local cluster
with a kubelet; or the cluster ``KUBECONFIG`` points at) and
``tests.e2e_helpers`` (API clients for the end-to-end tests on the local cluster).
"""

pytest_plugins = ["tests.registry", "tests.cluster.fixture", "tests.e2e_helpers"]
