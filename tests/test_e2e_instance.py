"""End to end: the DESIGN's core flow, a bundle image applied by an instance pod.

On the local cluster's real node, with RukPak installed from ``deploy/`` (the
``rukpak_system`` fixture: the node plugin DaemonSet, the CRDs, the manager and the
identities of the pods it runs): the hello bundle (its namespace made unique and its
Deployment's image the cluster's busybox) pushed as an image. Then a one-replica
Deployment (Recreate) of the test's own, in rukpak-system, whose pod mounts the bundle
read-only at ``/bundle`` through an inline CSI volume and runs ``rukpak-provisioner
instance`` as the installed default instance identity ``rukpak-instance``: the shipped
RBAC must be enough for the instance process. There is no kube-proxy, so the pod uses
hostNetwork and reaches the API server on loopback (``in_cluster_env``). In order: the
bundle's objects appear with the owner label and the inventory ConfigMap exists; a
deleted managed ConfigMap comes back; deleting the Deployment stops the pod through
SIGTERM, which releases the Lease. (The manager's own instance Deployments are tested
through BundleDeployments in ``test_e2e_install``.)
"""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from provisioner.engine import inventory, lifecycle
from provisioner.engine.kube import Kube
from provisioner.engine.objects import OWNER_LABEL, ObjectRef
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
    instance: str  # the Deployment running the instance pod
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


def instance_deployment(cluster: Any, names: Names, *, image: str, bundle: str) -> dict[str, Any]:
    """The Deployment whose pod runs the instance process as ``rukpak-instance``."""
    labels = {"app.kubernetes.io/name": names.instance, "app.kubernetes.io/part-of": "rukpak-e2e"}
    env = [{"name": k, "value": v} for k, v in cluster.in_cluster_env().items()]
    env.append({"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    command = ["/opt/rukpak/bin/rukpak-provisioner", "instance", "--bundle-dir", "/bundle"]
    command += ["--name", names.deployment, "--namespace", names.target]
    command += ["--system-namespace", names.system]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": names.instance, "namespace": names.system, "labels": labels},
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {"app.kubernetes.io/name": names.instance}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "serviceAccountName": SERVICE_ACCOUNT,
                    "hostNetwork": True,
                    "terminationGracePeriodSeconds": 30,
                    "containers": [
                        {
                            "name": "instance",
                            "image": image,
                            "command": command,
                            "env": env,
                            "volumeMounts": [
                                {"name": "bundle", "mountPath": "/bundle", "readOnly": True}
                            ],
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
            },
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


@dataclass
class Running:
    deployment: dict[str, Any]


@pytest.fixture(scope="module")
def running(
    rukpak_system: inst.RukpakSystem, kube: Kube, names: Names, bundle_image: str
) -> Iterator[Running]:
    """The instance Deployment applied; everything the test made removed afterwards."""
    deployment = instance_deployment(
        rukpak_system.cluster, names, image=rukpak_system.image, bundle=bundle_image
    )
    try:
        kube.apply(deployment)
        yield Running(deployment)
    finally:
        kube.delete(ObjectRef.of(deployment))
        eventually(
            lambda: not _instance_pods(kube, names), timeout=60, what="the instance pod to go"
        )
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


class TestTheInstancePod:
    """In file order: each test builds on the state the previous one left."""

    def test_it_applies_the_bundle_from_its_csi_volume_and_holds_the_lease(
        self, rukpak_system: inst.RukpakSystem, kube: Kube, names: Names, running: Running
    ) -> None:
        greeting = ObjectRef("", "v1", "ConfigMap", names.target, GREETING)
        try:
            live = eventually(lambda: kube.get(greeting), timeout=120, what="hello-greeting")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{_describe(rukpak_system, names)}") from None
        assert live["metadata"]["labels"][OWNER_LABEL] == names.deployment
        for ref in (
            ObjectRef("", "v1", "Namespace", "", names.target),
            ObjectRef("apps", "v1", "Deployment", names.target, "hello"),
        ):
            obj = eventually(functools.partial(kube.get, ref), timeout=30, what=str(ref))
            assert obj["metadata"]["labels"][OWNER_LABEL] == names.deployment
        inv_ref = ObjectRef(
            "", "v1", "ConfigMap", names.system, inventory.configmap_name(names.deployment)
        )
        assert eventually(lambda: kube.get(inv_ref), timeout=30, what="the inventory ConfigMap")
        (pod,) = _instance_pods(kube, names)
        assert _lease_holder(kube, names) == pod["metadata"]["name"]  # $POD_NAME

    def test_a_deleted_managed_configmap_is_restored(
        self, kube: Kube, names: Names, running: Running
    ) -> None:
        greeting = ObjectRef("", "v1", "ConfigMap", names.target, GREETING)
        before = kube.get(greeting)
        assert before is not None
        assert kube.delete(greeting)

        def recreated() -> dict[str, Any] | None:
            live = kube.get(greeting)
            if live is None or live["metadata"]["uid"] == before["metadata"]["uid"]:
                return None
            return live

        restored = eventually(recreated, timeout=30, what="the deleted ConfigMap to be restored")
        assert restored["data"] == before["data"]
        assert restored["metadata"]["labels"][OWNER_LABEL] == names.deployment

    def test_deleting_the_instance_deployment_stops_the_pod_and_releases_the_lease(
        self, kube: Kube, names: Names, running: Running
    ) -> None:
        (pod,) = _instance_pods(kube, names)
        assert _lease_holder(kube, names) == pod["metadata"]["name"]
        assert kube.delete(ObjectRef.of(running.deployment))
        eventually(
            lambda: not _instance_pods(kube, names), timeout=60, what="the instance pod to go"
        )
        # only a release empties the holder: an expired Lease still names its holder
        assert _lease_holder(kube, names) == ""
