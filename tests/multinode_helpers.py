"""pytest plugin: the multi-node local cluster, and RukPak installed on it as users install
it (no host-network component: the manager, its webhooks and ``contentURL`` are reached
through Services).

Where it sits: tests marked ``multinode`` (``tests/test_multinode*.py``) take
``multinode_cluster`` (``tests.cluster`` with ``nodes=NODES``: each node its own network
and mount namespaces, kube-proxy, CoreDNS) or ``multinode_system``. ``make test`` runs
them in a pytest run of their own after the others, so the single-node cluster of the
other end-to-end tests is gone by then. They need root and network namespaces; where the
machine has neither, they skip and say which.

Enable with ``pytest_plugins = [..., "tests.multinode_helpers"]``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import image_helpers, install_helpers
from tests.cluster import bins, machines
from tests.cluster.localcluster import LocalCluster
from tests.cluster.machines import NodeMachine

NODES = 3


def missing_capability() -> str:
    """Why this machine cannot run the multi-node cluster ('' when it can)."""
    if os.geteuid() != 0:
        return "the multi-node cluster needs root (network and mount namespaces)"
    for tool in ("ip", "nsenter", "unshare", "iptables"):
        if shutil.which(tool) is None:
            return f"the multi-node cluster needs `{tool}` on PATH"
    probe = subprocess.run(["unshare", "--net", "--mount", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot make network namespaces here: {probe.stderr.strip()}"
    return ""


@pytest.fixture(scope="session")
def multinode_cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """A started cluster of ``NODES`` nodes, every node Ready and CoreDNS serving."""
    reason = missing_capability()
    if reason:
        pytest.skip(reason)
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        found = bins.ensure(bins.MULTINODE)
    workdir = Path(tempfile.mkdtemp(prefix="rk-mn-"))
    cluster = LocalCluster.start(workdir, nodes=NODES, binaries=found)
    try:
        yield cluster
    finally:
        cluster.stop(remove=True)
        if request.session.testsfailed:
            print(f"\nmultinode cluster: component logs kept in {cluster.logs_dir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def multinode_system(
    multinode_cluster: LocalCluster, request: pytest.FixtureRequest
) -> Iterator[install_helpers.RukpakSystem]:
    """RukPak installed on the multi-node cluster from ``deploy/`` with the kubelet-root
    component only (the default install: the standing provisioner, no pod per change), the
    plugin's cache at the same path on every node (each its own)."""
    workdir = Path(tempfile.mkdtemp(prefix="rk-mn-install-"))
    system = install_system(multinode_cluster, workdir, request=request)
    try:
        yield system
    finally:
        try:
            install_helpers.uninstall(system)
        finally:
            system.kube.close()
            shutil.rmtree(workdir, ignore_errors=True)


def install_system(
    cluster: LocalCluster, workdir: Path, *, request: pytest.FixtureRequest | None = None
) -> install_helpers.RukpakSystem:
    """Build and push the image, install ``deploy/`` with the kubelet-root component only
    (the default install: runs taken by the standing provisioner; and the cluster's
    plain-HTTP registries), wait for the rollouts."""
    ref = f"{cluster.registry_host}/rukpak/rukpak-python:e2e"
    image = image_helpers.build_and_push(ref, request=request, insecure=(cluster.registry_host,))
    return install_helpers.install(
        cluster,
        workdir,
        image,
        components=("kubelet-root",),
        state_dir=machines.common_dir(cluster.workdir) / "rukpak-csi",
        # every registry the tests start lives at the control plane's address
        patches=insecure_registry(cluster.registry_host.rsplit(":", 1)[0]),
    )


def insecure_registry(host: str) -> tuple[dict[str, Any], ...]:
    """Kustomize patches: the node plugin and the manager speak plain HTTP to ``host`` (any
    port of it without one; the cluster's registry is not on loopback here), as a user with
    such a registry would."""
    add = yaml.safe_dump(
        [
            {
                "op": "add",
                "path": "/spec/template/spec/containers/0/args/-",
                "value": f"--insecure-registry={host}",
            }
        ]
    )
    return (
        {"target": {"kind": "DaemonSet", "name": install_helpers.DAEMONSET}, "patch": add},
        {"target": {"kind": "Deployment", "name": install_helpers.MANAGER}, "patch": add},
    )


def machine(cluster: LocalCluster, name: str) -> NodeMachine:
    return next(m for m in cluster.machines if m.name == name)


def state_dir_of(cluster: LocalCluster, name: str) -> Path:
    """Node ``name``'s plugin cache, as the host sees it."""
    return machine(cluster, name).layout.workdir / "rukpak-csi"


def reader_spec(system: install_helpers.RukpakSystem, ref: str, check: str) -> dict[str, Any]:
    """A pod spec: busybox mounting image ``ref`` as an inline CSI volume at /bundle,
    running while ``check`` holds there (no grace period: tests delete it at once)."""
    return {
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "reader",
                "image": system.busybox_image,
                "command": ["sh", "-c", f"{check} && sleep 3600"],
                "volumeMounts": [{"name": "bundle", "mountPath": "/bundle"}],
            }
        ],
        "volumes": [
            {
                "name": "bundle",
                "csi": {
                    "driver": "csi.rukpak.io",
                    "readOnly": True,
                    "volumeAttributes": {"image": ref},
                },
            }
        ],
    }


def reader_pods(
    system: install_helpers.RukpakSystem,
    namespace: str,
    ref: str,
    nodes: list[str],
    *,
    check: str = "test -d /bundle/manifests",
    prefix: str = "reader",
) -> list[dict[str, Any]]:
    """A reader pod (:func:`reader_spec`) per entry of ``nodes``
    (``<prefix>-<i>-<node>``), bound to that node."""
    return [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"{prefix}-{i}-{node}", "namespace": namespace},
            "spec": {"nodeName": node, **reader_spec(system, ref, check)},
        }
        for i, node in enumerate(nodes)
    ]
