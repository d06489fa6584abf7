"""pytest plugin: session fixtures for a real Kubernetes on loopback.

``kube_apiserver`` is etcd + kube-apiserver only (seconds to start); ``kube_cluster`` is
the whole single-node cluster of ``localcluster`` with its Node Ready. With ``KUBECONFIG``
set, both yield that cluster instead, start nothing and stop nothing (``make cluster-up``
then ``export KUBECONFIG=...`` runs the suite against one long-lived cluster). When a
test using them fails, the tail of every component's log is added to its report.

Enable with ``pytest_plugins = ["tests.cluster.fixture"]`` (or ``-p tests.cluster.fixture``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Generator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.cluster import bins, images
from tests.cluster.localcluster import STATE_FILE, LocalCluster

_STARTED: dict[str, LocalCluster] = {}


@dataclass(frozen=True)
class ExternalCluster:
    """The cluster ``KUBECONFIG`` points at; node-side paths are unknown (None)."""

    kubeconfig: Path
    server: str
    registry_host: str | None = None
    busybox_image: str | None = None
    pause_image: str | None = None
    kubelet_dir: Path | None = None
    plugins_registry_dir: Path | None = None
    pods_dir: Path | None = None
    node_name: str | None = None


def external_cluster() -> LocalCluster | ExternalCluster | None:
    """The cluster of ``$KUBECONFIG`` (first file, current context), if the variable is set;
    a ``python -m tests.cluster up`` cluster is loaded whole (registry, kubelet dirs)."""
    value = os.environ.get("KUBECONFIG")
    if not value:
        return None
    path = Path(value.split(os.pathsep)[0])
    if (path.parent / STATE_FILE).exists():
        return LocalCluster.load(path.parent)
    config = yaml.safe_load(path.read_text())
    context = next(c for c in config["contexts"] if c["name"] == config["current-context"])
    cluster = next(c for c in config["clusters"] if c["name"] == context["context"]["cluster"])
    return ExternalCluster(kubeconfig=path, server=cluster["cluster"]["server"])


def _workdir(name: str) -> Path:
    # short paths: unix sockets under the kubelet dir must stay below 108 bytes
    return Path(tempfile.mkdtemp(prefix=f"rk-{name}-"))


def _shared_registry(workdir: Path) -> images.Registry | None:
    """``tests.registry``'s server when that module exists; else the cluster starts its own."""
    try:
        from tests import registry  # type: ignore[attr-defined]
    except ImportError:
        return None
    server = getattr(registry, "RegistryServer", None)
    if server is None:
        return None
    return server.start(workdir, auth="none")  # type: ignore[no-any-return]


def _run(
    name: str, request: pytest.FixtureRequest, *, node: bool
) -> Iterator[LocalCluster | ExternalCluster]:
    external = external_cluster()
    if external is not None:
        yield external
        return
    # a first build takes minutes: let its progress through pytest's output capture
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        found = bins.ensure(bins.ALL if node else bins.CONTROL_PLANE)
    workdir = _workdir(name)
    registry = _shared_registry(workdir / "shared-registry") if node else None
    try:
        cluster = LocalCluster.start(workdir, node=node, registry=registry, binaries=found)
    except BaseException:
        if registry is not None:
            registry.stop()
        raise
    _STARTED[name] = cluster
    try:
        yield cluster
    finally:
        _STARTED.pop(name, None)
        cluster.stop(remove=True)
        if registry is not None:
            registry.stop()
        if request.session.testsfailed:
            print(f"\n{name}: component logs kept in {cluster.logs_dir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def kube_apiserver(request: pytest.FixtureRequest) -> Iterator[LocalCluster | ExternalCluster]:
    """etcd + kube-apiserver (RBAC on); ``.kubeconfig`` is an admin kubeconfig, ``.server``."""
    yield from _run("kube-apiserver", request, node=False)


@pytest.fixture(scope="session")
def kube_cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster | ExternalCluster]:
    """The full single-node cluster, Node Ready: kubeconfig, registry_host, busybox_image,
    kubelet_dir, plugins_registry_dir, pods_dir, node_name."""
    yield from _run("kube-cluster", request, node=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()  # type: ignore[attr-defined]
    if not report.failed:
        return
    used = getattr(item, "fixturenames", ())
    for name, fixture in (("kube-apiserver", "kube_apiserver"), ("kube-cluster", "kube_cluster")):
        cluster = _STARTED.get(name)
        if cluster is None or fixture not in used:
            continue
        for component, tail in cluster.log_tails().items():
            report.sections.append((f"{name} log: {component} (last lines)", tail))
