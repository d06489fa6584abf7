"""End to end: the DESIGN's core flow, a bundle image applied by an instance pod.

On the local cluster's real node, with RukPak installed from ``deploy/`` (the
``rukpak_system`` fixture: the node plugin DaemonSet, the CRDs, the manager and the
identities of the pods it runs): the hello bundle (its namespace made unique and its
Deployment's image the cluster's busybox) pushed as an image. Then a run pod of the
test's own (restart policy Never), in rukpak-system, that mounts the bundle read-only
at ``/bundle`` through an inline CSI volume and runs ``rukpak-provisioner instance`` as
the installed default instance identity ``rukpak-instance``: the shipped RBAC must be
enough for the instance process. There is no kube-proxy, so the pod uses hostNetwork
and reaches the API server on loopback (``in_cluster_env``). The pod succeeds; the
bundle's objects carry the owner label; the inventory ConfigMap holds the install
record the pod wrote; the Lease is released. (The manager's own runs are tested
through BundleDeployments in ``test_e2e_install`` and ``test_e2e_runs``.)

It stays on ``rukpak_system`` (the ``run-pods`` component) because its subject is the run
pod itself: the pod, its volume and its identity, as the ``run-pods`` install runs them.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from provisioner.engine.apply import inventory, lifecycle
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import OWNER_LABEL, ObjectRef
from provisioner.manager.planning import runs
from provisioner.runtime import lease
from rukpak.common import errors
from tests import e2e_helpers as e2e
from tests import install_helpers as inst
from tests.polling import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

GREETING = "hello-greeting"
SERVICE_ACCOUNT = "rukpak-instance"  # the installed default identity of instance pods


@dataclass(frozen=True)
class Names:
    deployment: str  # the rukpak deployment name: owner label, inventory, Lease
    instance: str  # the run pod
    target: str  # the bundle's own namespace
    system: str = inst.NAMESPACE  # the instance pod, the Lease and the inventory


@pytest.fixture(scope="module")
def names() -> Names:
    suffix = uuid.uuid4().hex[:6]
    return Names(
        deployment=f"inst-{suffix}", instance=f"e2e-instance-{suffix}", target=f"e2e-hello-{suffix}"
    )


@pytest.fixture(scope="module")
def kube(rukpak_system: inst.RukpakSystem) -> Kube:
    return rukpak_system.kube


@pytest.fixture(scope="module")
def bundle_image(
    rukpak_system: inst.RukpakSystem, names: Names, tmp_path_factory: pytest.TempPathFactory
) -> str:
    root = inst.hello_bundle(
        tmp_path_factory.mktemp("hello") / "bundle",
        namespace=names.target,
        image=rukpak_system.busybox_image,
    )
    ref = f"{rukpak_system.registry_host}/rukpak-e2e/hello-instance:{names.target}"
    e2e.push_bundle(root, ref)
    return ref


def instance_pod(cluster: Any, names: Names, *, image: str, bundle: str) -> dict[str, Any]:
    """The run pod that runs the instance process as ``rukpak-instance``."""
    labels = {"app.kubernetes.io/name": names.instance, "app.kubernetes.io/part-of": "rukpak-e2e"}
    env = [{"name": k, "value": v} for k, v in cluster.in_cluster_env().items()]
    env.append({"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    command = ["/opt/rukpak/bin/rukpak-provisioner", "instance", "--bundle-dir", "/bundle"]
    command += ["--name", names.deployment, "--namespace", names.target]
    command += ["--system-namespace", names.system, "--bundle", "hello-e2e"]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": names.instance, "namespace": names.system, "labels": labels},
        "spec": {
            "serviceAccountName": SERVICE_ACCOUNT,
            "restartPolicy": "Never",
            "hostNetwork": True,
            "containers": [
                {
                    "name": "instance",
                    "image": image,
                    "command": command,
                    "env": env,
                    "volumeMounts": [{"name": "bundle", "mountPath": "/bundle", "readOnly": True}],
                }
            ],
            "volumes": [
                {
                    "name": "bundle",
                    "csi": {
                        "driver": e2e.DRIVER,
                        "readOnly": True,
                        "volumeAttributes": {"image": bundle},
                    },
                }
            ],
        },
    }


def _instance_pods(kube: Kube, names: Names) -> list[dict[str, Any]]:
    pods, _ = kube.list(
        "v1",
        "Pod",
        namespace=names.system,
        label_selector=f"app.kubernetes.io/name={names.instance}",
    )
    return pods


def _describe(system: inst.RukpakSystem, names: Names) -> str:
    """What a failure message needs: the instance pods' state and events, the plugin log."""
    lines = []
    for pod in _instance_pods(system.kube, names):
        lines.append(f"pod {pod['metadata']['name']}: {pod.get('status')}")
    lines.append(system.describe("pods"))
    return "\n".join(lines)


@pytest.fixture(scope="module")
def finished(
    rukpak_system: inst.RukpakSystem, kube: Kube, names: Names, bundle_image: str
) -> Iterator[dict[str, Any]]:
    """The run pod, once it ended; everything the test made removed afterwards."""
    pod = instance_pod(rukpak_system.cluster, names, image=rukpak_system.image, bundle=bundle_image)
    try:
        kube.create(pod)
        try:
            ended = eventually(
                lambda: (
                    p
                    if (p := kube.get(ObjectRef.of(pod)))
                    and p.get("status", {}).get("phase") in ("Succeeded", "Failed")
                    else None
                ),
                timeout=180,
                what="the run pod to end",
            )
        except AssertionError as e:
            raise AssertionError(f"{e}\n{_describe(rukpak_system, names)}") from None
        yield ended
    finally:
        kube.delete(ObjectRef.of(pod))
        eventually(lambda: not _instance_pods(kube, names), timeout=60, what="the run pod to go")
        # NotFound when nothing was installed (an earlier failure): nothing to remove
        with contextlib.suppress(errors.NotFound):
            lifecycle.uninstall(kube, names.deployment, system_namespace=names.system)
        kube.delete(ObjectRef("", "v1", "Namespace", "", names.target))


def _lease_holder(kube: Kube, names: Names) -> str | None:
    ref = ObjectRef(
        "coordination.k8s.io", "v1", "Lease", names.system, lease.lease_name(names.deployment)
    )
    live = kube.get(ref)
    return None if live is None else str(live["spec"].get("holderIdentity") or "")


def test_a_run_pod_applies_the_bundle_from_its_csi_volume_records_it_and_releases_the_lease(
    rukpak_system: inst.RukpakSystem, kube: Kube, names: Names, finished: dict[str, Any]
) -> None:
    assert finished["status"]["phase"] == "Succeeded", _describe(rukpak_system, names)
    for ref in (
        ObjectRef("", "v1", "ConfigMap", names.target, GREETING),
        ObjectRef("", "v1", "Namespace", "", names.target),
        ObjectRef("apps", "v1", "Deployment", names.target, "hello"),
    ):
        obj = kube.get(ref)
        assert obj is not None, ref
        assert obj["metadata"]["labels"][OWNER_LABEL] == names.deployment
    inv_ref = ObjectRef(
        "", "v1", "ConfigMap", names.system, inventory.configmap_name(names.deployment)
    )
    record = runs.InstallRecord.of_inventory(kube.get(inv_ref))
    assert record is not None and record.applied is not None
    assert (record.by, record.bundle) == (names.instance, "hello-e2e")  # $POD_NAME
    assert len(record.applied) >= 3
    assert _lease_holder(kube, names) == ""  # released on the way out
