"""Shared pytest configuration and fixtures.

Heavy real components are session fixtures provided by plugin modules:
``tests.registry`` (Debian's docker-registry, plain, htpasswd and token auth),
``tests.cluster.fixture`` (etcd + kube-apiserver, and the full local cluster
with a kubelet; or the cluster ``KUBECONFIG`` points at) and
``tests.e2e_helpers`` (API clients for the end-to-end tests on the local cluster).

Here: the engine's API client on that kube-apiserver (``kube``; modules that need
more, such as installed CRDs, define their own) and a fresh deployment name per test
(``name``), so tests share one API server without seeing each other's objects.
Bundle manifests for these tests are built with ``tests.bundles``.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from provisioner.engine.kube.kube import Kube

pytest_plugins = [
    "tests.registry",
    "tests.cluster.fixture",
    "tests.e2e_helpers",
    "tests.install_helpers",
    "tests.multinode_helpers",
]


@pytest.fixture(scope="session")
def kube(kube_apiserver: Any) -> Iterator[Kube]:
    """The engine's API adapter on the session's kube-apiserver (admin credentials)."""
    client = Kube.from_kubeconfig(str(kube_apiserver.kubeconfig))
    yield client
    client.close()


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """Give back the root logger as it was: a command run in-process (``cli.main``) points it
    at that test's captured stderr, which is closed when the test ends while threads of
    module-scoped controllers go on logging."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def name() -> str:
    """A deployment (and namespace) name no other test uses."""
    return f"t-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def group(name: str) -> str:
    """A CRD API group no other test uses (``<name>.example.com``)."""
    return f"{name}.example.com"


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that install a release with helm (``released_system``, tests/test_release.py)
    run after the host-process plugin's e2e tests and before those of ``rukpak_system``
    (tests.install_helpers): both own the kubelet's csi.rukpak.io registration while they run.
    Of those, the tests of the default install (``standing_system``) run last: the switch to
    it is made once and never undone. On the multi-node cluster, the pre-stage tests
    (tests/test_multinode_prestage.py) run before tests/test_multinode.py, whose last tests
    take nodes down for good: a DaemonSet there rolls out on every node."""

    def rank(item: pytest.Item) -> int:
        names = getattr(item, "fixturenames", ())
        if "multinode_system" in names or "multinode_cluster" in names:
            return 0 if "prestage" in item.nodeid.split("::")[0] else 1
        if "standing_system" in names:
            return 3
        return 2 if "rukpak_system" in names else 1 if "released_system" in names else 0

    items.sort(key=rank)
