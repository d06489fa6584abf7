"""Shared pytest configuration.

Heavy real components are session fixtures provided by plugin modules:
``tests.registry`` (Debian's docker-registry, plain, htpasswd and token auth)
and ``tests.cluster.fixture`` (etcd + kube-apiserver, and the full local
cluster with a kubelet; or the cluster ``KUBECONFIG`` points at).
"""

pytest_plugins = ["tests.registry", "tests.cluster.fixture"]
