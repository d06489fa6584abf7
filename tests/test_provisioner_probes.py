"""The probes of the provisioner processes, as their containers run them.

``rukpak-provisioner manager`` answers ``/livez`` on its HTTPS webhook port and
``rukpak-provisioner volumes`` answers ``/livez`` and ``/healthz`` on ``--health-port``
(``provisioner.runtime.liveness``), and ``/metrics`` on ``--metrics-port``. Real processes
on loopback: a PV provisioner waiting
for a plugin that is not there, then one with the real plugin process and kube-apiserver;
two managers, leader and standby, on kube-apiserver with the CRDs installed, the standby
taking over when the leader stops.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from provisioner.engine.kube.kube import Kube
from tests.crd_helpers import install_crds
from tests.csi_helpers import PluginProcess, free_port, terminate
from tests.httpreply import probe
from tests.polling import eventually

REPO_ROOT = Path(__file__).resolve().parent.parent


def get(url: str) -> tuple[int, str]:
    """GET ``url`` as kubelet's probe does (HTTPS unverified): (status, message)."""
    status, body = probe(url)
    return status, str(json.loads(body)["message"])


def answering(url: str) -> tuple[int, str] | None:
    try:
        return get(url)
    except OSError:
        return None  # not listening yet


def scrape(port: int) -> str:
    """The Prometheus text of ``/metrics`` on loopback ``port``."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        return str(answer.read().decode())


def start(log: Path, *args: str, **env: str) -> subprocess.Popen[bytes]:
    """``python -m provisioner ARGS`` with ``env`` added, its output in ``log``."""
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "provisioner", *args],
            cwd=REPO_ROOT,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


# -- the PV provisioner ----------------------------------------------------------------------


def test_the_pv_provisioner_is_live_but_not_ready_while_it_waits_for_its_plugin(
    tmp_path: Path,
) -> None:
    port, metrics_port = free_port(), free_port()
    missing = tmp_path / "csi.sock"
    proc = start(
        tmp_path / "volumes.log",
        *("volumes", "--csi-address", str(missing), "--connect-timeout", "120"),
        *("--health-port", str(port), "--health-bind", "127.0.0.1"),
        *("--metrics-port", str(metrics_port), "--metrics-bind", "127.0.0.1"),
    )
    try:
        base = f"http://127.0.0.1:{port}"
        live = eventually(lambda: answering(base + "/livez"), timeout=30, what="/livez")
        assert live == (200, f"waiting for the CSI plugin at {missing}")
        assert get(base + "/healthz") == (
            503,
            f"not connected to the CSI plugin at {missing} yet",
        )
        # its metrics answer from the start: not leading, the families declared
        text = scrape(metrics_port)
        assert 'leader_election_master_status{name="rukpak-csi-provisioner"} 0.0' in text
        assert "# TYPE controller_persistentvolumeclaim_provision_total counter" in text
        assert "# TYPE controller_persistentvolume_delete_failed_total counter" in text
        assert "# TYPE csi_sidecar_operations_seconds histogram" in text
        assert "\nprocess_resident_memory_bytes " in text
    finally:
        proc.kill()
        proc.wait(timeout=10)


@pytest.mark.cluster
def test_the_pv_provisioner_with_its_plugin_leads_and_is_ready(
    kube_apiserver: Any, kube: Kube, tmp_path: Path, name: str
) -> None:
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    plugin = PluginProcess(tmp_path / "plugin", extra_args=("--controller",)).start()
    port, metrics_port = free_port(), free_port()
    proc = start(
        tmp_path / "volumes.log",
        *("volumes", "--csi-address", str(plugin.socket), "--driver-name", "csi.rukpak.io"),
        *("--leader-elect", "--leader-election-namespace", name),
        *("--health-port", str(port), "--health-bind", "127.0.0.1"),
        *("--metrics-port", str(metrics_port), "--metrics-bind", "127.0.0.1"),
        KUBECONFIG=str(kube_apiserver.kubeconfig),
        POD_NAME="provisioner-0",
    )
    try:
        base = f"http://127.0.0.1:{port}"
        eventually(
            lambda: (a := answering(base + "/livez")) and a[1].startswith("leading: "),
            timeout=90,
            what="the provisioner leading",
        )
        code, message = get(base + "/healthz")
        assert code == 200 and message.startswith("leading: "), message
        text = scrape(metrics_port)
        assert 'leader_election_master_status{name="rukpak-csi-provisioner"} 1.0' in text
        assert 'workqueue_depth{name="volumes"}' in text
        assert 'controller_runtime_max_concurrent_reconciles{controller="volumes"}' in text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        terminate(proc)
        plugin.stop()


# -- the manager -----------------------------------------------------------------------------


@pytest.fixture
def crds(kube: Kube) -> Iterator[None]:
    install_crds(kube)
    yield
    install_crds(kube)  # the managers wrote their CA into the conversion: back to this process's


@pytest.mark.cluster
def test_two_managers_answer_livez_as_leader_and_standby_and_the_standby_takes_over(
    kube_apiserver: Any, kube: Kube, crds: None, tmp_path: Path, name: str
) -> None:
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    managers: list[tuple[subprocess.Popen[bytes], str]] = []
    try:
        for i in range(2):
            port = free_port()
            proc = start(
                tmp_path / f"manager-{i}.log",
                *("manager", "--image", "rukpak:test", "--system-namespace", name),
                *("--leader-elect", "--webhook-bind", "127.0.0.1", "--webhook-port", str(port)),
                KUBECONFIG=str(kube_apiserver.kubeconfig),
                POD_NAME=f"manager-{i}",
            )
            managers.append((proc, f"https://127.0.0.1:{port}/livez"))

        def roles() -> tuple[int, int] | None:
            answers = [answering(url) for _, url in managers]
            if not all(a and a[0] == 200 for a in answers):
                return None
            messages = [a[1] for a in answers if a]
            leading = [i for i, m in enumerate(messages) if m.startswith("leading: ")]
            waiting = [
                i for i, m in enumerate(messages) if m == "waiting for the Lease rukpak-manager"
            ]
            return (leading[0], waiting[0]) if leading and waiting else None

        leader, standby = eventually(roles, timeout=90, what="a leader and a standby")
        managers[leader][0].send_signal(signal.SIGTERM)  # releases the Lease on its way out
        assert managers[leader][0].wait(timeout=30) == 0
        eventually(
            lambda: (a := answering(managers[standby][1])) and a[1].startswith("leading: "),
            timeout=60,
            what="the standby leading",
        )
    finally:
        for proc, _ in managers:
            terminate(proc)
