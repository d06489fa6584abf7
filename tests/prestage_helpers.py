"""One pre-staged (or not) pivot on the multi-node cluster, for the e2e test and the bench.

Where it sits: used by ``tests/test_multinode_prestage.py`` (on the session's
``multinode_system``) and ``tests/bench/bench_prestage.py`` (on a cluster of its own), both
on RukPak installed from ``deploy/`` (whose node plugins run ``--prestage=follow``).

The scenario, as a user runs it: a v1alpha2 BundleDeployment pins ``<repo>@<v1>``; a
DaemonSet (one pod per node, the default rolling update: one node at a time) mounts the
same pinned content through an inline CSI volume. The spec changes to ``<v2>``; the
BundleDeployment pivots (``status.resolvedSource``) and the DaemonSet is rolled to ``<v2>``
right after, as a CD tool following the BundleDeployment would. "All nodes serving" is the
DaemonSet's rollout finished: every node's pod Running on ``<v2>``. With pre-staging (the
BundleDeployment's ``prestage.rukpak.io/timeout``), the pivot waits until the nodes that
hold ``<repo>`` fetched ``<v2>``, all at once; without, each pod fetches it at its publish,
one node after the other.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from provisioner.engine.objects import Obj
from provisioner.manager import model
from provisioner.manager.acting import actuate
from rukpak.common import prestage as words
from rukpak.oci import client as oci_client
from rukpak.oci.reference import Reference
from tests import e2e_helpers as e2e
from tests import install_helpers as inst
from tests.bundles import configmap, namespace, write_bundle
from tests.multinode_helpers import reader_spec
from tests.polling import until


@dataclass(frozen=True)
class Pivot:
    """What one pivot took (seconds from the spec change) and left."""

    pinned: float
    """-> ``status.resolvedSource`` names v2 (after pre-staging, when on)."""
    serving: float
    """-> the DaemonSet's rollout to v2 finished on every node."""
    v2: str
    """The pinned reference pivoted to."""


def push(system: inst.RukpakSystem, root: Path, ref: str, ns: str, payload: int) -> str:
    """Push a bundle of one ConfigMap and ``payload`` random bytes (``data.bin``) as
    ``ref``; its pinned reference."""
    write_bundle(root, {"app.yaml": [namespace(ns), configmap("hello", ns, greeting=root.name)]})
    (root / "data.bin").write_bytes(os.urandom(payload))
    e2e.push_bundle(root, ref, insecure=True)
    client = oci_client.RegistryClient(insecure=(system.registry_host,), retries=2)
    with client:
        digest = client.resolve(Reference.parse(ref)).digest
    return f"{ref.rsplit(':', 1)[0]}@{digest}"


def daemonset(system: inst.RukpakSystem, name: str, ns: str, ref: str) -> dict[str, Any]:
    """A DaemonSet whose pod on each node mounts pinned ``ref`` and runs while its data
    is there."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "selector": {"matchLabels": labels},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
            "template": {
                "metadata": {"labels": labels},
                "spec": reader_spec(system, ref, "test -s /bundle/data.bin"),
            },
        },
    }


def rolled_out(system: inst.RukpakSystem, name: str, ns: str, ref: str) -> bool:
    """Whether DaemonSet ``name`` runs ``ref`` on every node, each pod Running."""
    ds = json.loads(system.kubectl("get", "daemonset", name, "-n", ns, "-o", "json"))
    status = ds.get("status") or {}
    nodes = len(system.cluster.node_names)
    if status.get("observedGeneration", 0) < ds["metadata"]["generation"]:
        return False
    if status.get("updatedNumberScheduled") != nodes or status.get("numberAvailable") != nodes:
        return False
    pods = json.loads(system.kubectl("get", "pods", "-n", ns, "-l", f"app={name}", "-o", "json"))
    mounted = [
        p
        for p in pods["items"]
        if not p["metadata"].get("deletionTimestamp")
        and p["spec"]["volumes"][0]["csi"]["volumeAttributes"]["image"] == ref
        and p["status"].get("phase") == "Running"
    ]
    return len(mounted) == nodes


def live(system: inst.RukpakSystem, name: str) -> Obj:
    return system.kube.get(actuate.bd_ref(name, model.API_VERSION_V2)) or {}


def pinned_ref(bd: Obj) -> str:
    source = (bd.get("status") or {}).get("resolvedSource") or {}
    return str((source.get("image") or {}).get("ref") or "")


def wait(check: Any, *, timeout: float, what: str, interval: float = 0.2) -> None:
    until(check, timeout=timeout, what=what, interval=interval)


def prepare(
    system: inst.RukpakSystem, workdir: Path, *, name: str, payload: int, prestage: float
) -> tuple[str, str]:
    """Revision one installed-and-served: the BD ``name`` pinned to v1 (pre-staging
    ``prestage`` seconds at most; 0 off) and its DaemonSet Running v1 on every node.
    Returns (namespace, v1)."""
    ns = name
    system.kubectl("create", "namespace", ns)
    repo = f"{system.registry_host}/prestage/{name}"
    v1 = push(system, workdir / f"{name}-v1", f"{repo}:v1", ns, payload)
    bd = inst.bd_v2(name, v1, installNamespace=ns)
    bd["metadata"]["annotations"] = {words.TIMEOUT_ANNOTATION: f"{prestage:g}"}
    system.kubectl("apply", "-f", "-", stdin=json.dumps(bd))
    wait(lambda: pinned_ref(live(system, name)) == v1, timeout=120, what=f"{name} pinned to v1")
    system.kubectl("apply", "-f", "-", stdin=json.dumps(daemonset(system, name, ns, v1)))
    wait(lambda: rolled_out(system, name, ns, v1), timeout=300, what=f"{name}'s DaemonSet on v1")
    return ns, v1


def pivot(system: inst.RukpakSystem, workdir: Path, *, name: str, ns: str, payload: int) -> Pivot:
    """Push v2, change the BD's spec to it, roll the DaemonSet once the BD pivoted; how
    long each took from the spec change."""
    repo = f"{system.registry_host}/prestage/{name}"
    v2 = push(system, workdir / f"{name}-v2", f"{repo}:v2", ns, payload)
    patch = {"spec": {"source": {"type": "image", "image": {"ref": v2}}}}
    started = time.monotonic()
    system.kubectl("patch", "bundledeployments.v1alpha2.core.rukpak.io", name, "--type=merge",
                   "-p", json.dumps(patch))  # fmt: skip
    wait(lambda: pinned_ref(live(system, name)) == v2, timeout=600, what=f"{name} pinned to v2")
    pinned = time.monotonic() - started
    system.kubectl("apply", "-f", "-", stdin=json.dumps(daemonset(system, name, ns, v2)))
    wait(lambda: rolled_out(system, name, ns, v2), timeout=900, what=f"{name}'s DaemonSet on v2")
    return Pivot(pinned, time.monotonic() - started, v2)


def node_answers(system: inst.RukpakSystem) -> dict[str, dict[str, words.Answer]]:
    """Each node's pre-stage answers (its state annotation), by node name."""
    nodes = json.loads(system.kubectl("get", "nodes", "-o", "json"))["items"]
    return {
        n["metadata"]["name"]: words.parse_states(
            (n["metadata"].get("annotations") or {}).get(words.STATE_ANNOTATION)
        )
        for n in nodes
    }


def nodes_advertising(system: inst.RukpakSystem, digest: str) -> list[str]:
    """Nodes selected by the advert label of ``digest`` (as a nodeAffinity term would)."""
    out = system.kubectl("get", "nodes", "-l", words.cached_label(digest), "-o", "name")
    return sorted(line.removeprefix("node/") for line in out.split())
