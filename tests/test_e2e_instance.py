"""End to end: the DESIGN's core flow, a bundle image applied by an instance pod.

On the local cluster's real node: the hello bundle (its namespace made unique
and its Deployment's image the cluster's busybox) pushed as an image; our CSI
plugin as a host process registered with the kubelet; the project's image
(which holds ``rukpak-provisioner``) built and pushed. Then a one-replica
Deployment (Recreate) whose pod mounts the bundle read-only at ``/bundle``
through an inline CSI volume and runs ``rukpak-provisioner instance``. There
is no kube-proxy, so the pod uses hostNetwork and reaches the API server on
loopback (``in_cluster_env``); its ServiceAccount is bound to cluster-admin
for the test. In order: the bundle's objects appear with the owner label and
the inventory ConfigMap exists; a deleted managed ConfigMap comes back;
deleting the Deployment stops the pod through SIGTERM, which releases the Lease.
"""

from __future__ import annotations

import contextlib
import functools
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from csi.common import errors
from provisioner.engine import inventory, lifecycle
from provisioner.engine.kube import Kube
from provisioner.engine.objects import OWNER_LABEL, ObjectRef
from provisioner.instance import lease
from tests import e2e_helpers as e2e
from tests import image_helpers
from tests.polling import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

DEPLOYMENT = "hello"  # the rukpak deployment name: owner label, inventory, Lease
INSTANCE = "rukpak-instance-hello"  # the Deployment running the instance pod
GREETING = "hello-greeting"


@dataclass(frozen=True)
class Names:
    system: str  # the instance pod, its ServiceAccount, the Lease and the inventory
    target: str  # the bundle's own namespace


@pytest.fixture(scope="module")
def names() -> Names:
    suffix = uuid.uuid4().hex[:6]
    return Names(system=f"e2e-inst-{suffix}", target=f"e2e-hello-{suffix}")


@pytest.fixture(scope="module")
def kube(kube_cluster: Any) -> Iterator[Kube]:
    e2e.require_local_node(kube_cluster)
    client = Kube.from_kubeconfig(str(kube_cluster.kubeconfig))
    yield client
    client.close()


@pytest.fixture(scope="module")
def plugin(kube_cluster: Any) -> Iterator[e2e.HostPlugin]:
    e2e.require_local_node(kube_cluster)
    with e2e.api(kube_cluster) as api_client:
        e2e.apply_csidriver(api_client)
    started = e2e.HostPlugin.for_cluster(kube_cluster).start()
    try:
        yield started
    finally:
        started.stop()
        started.remove_state()


def adapted_hello(target: Path, *, namespace: str, image: str) -> Path:
    """The hello bundle living in ``namespace``, its Deployment running ``image``."""
    manifests = target / "manifests"
    manifests.mkdir(parents=True)
    for path in sorted((e2e.HELLO_BUNDLE / "manifests").iterdir()):
        doc = yaml.safe_load(path.read_text())
        if doc["kind"] == "Namespace":
            doc["metadata"]["name"] = namespace
        else:
            doc["metadata"]["namespace"] = namespace
        if doc["kind"] == "Deployment":
            for container in doc["spec"]["template"]["spec"]["containers"]:
                container["image"] = image
        (manifests / path.name).write_text(yaml.safe_dump(doc))
    return target


@pytest.fixture(scope="module")
def bundle_image(kube_cluster: Any, names: Names, tmp_path_factory: pytest.TempPathFactory) -> str:
    e2e.require_local_node(kube_cluster)
    root = adapted_hello(
        tmp_path_factory.mktemp("hello") / "bundle",
        namespace=names.target,
        image=kube_cluster.busybox_image,
    )
    ref = f"{kube_cluster.registry_host}/rukpak-e2e/hello-instance:{names.target}"
    e2e.push_bundle(root, ref)
    return ref


@pytest.fixture(scope="module")
def provisioner_image(kube_cluster: Any, request: pytest.FixtureRequest) -> str:
    e2e.require_local_node(kube_cluster)
    ref = f"{kube_cluster.registry_host}/rukpak/rukpak-python:e2e"
    return image_helpers.build_and_push(ref, request=request)


def instance_objects(
    cluster: Any, names: Names, *, image: str, bundle: str
) -> list[dict[str, Any]]:
    """Namespace, ServiceAccount, ClusterRoleBinding (cluster-admin) and the Deployment."""
    labels = {"app.kubernetes.io/name": INSTANCE, "app.kubernetes.io/part-of": "rukpak"}
    env = [{"name": k, "value": v} for k, v in cluster.in_cluster_env().items()]
    env.append({"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    command = ["/opt/rukpak/bin/rukpak-provisioner", "instance", "--bundle-dir", "/bundle"]
    command += ["--name", DEPLOYMENT, "--namespace", names.target]
    command += ["--system-namespace", names.system]
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": names.system}},
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": INSTANCE, "namespace": names.system, "labels": labels},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": names.system, "labels": labels},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "cluster-admin",
            },
            "subjects": [{"kind": "ServiceAccount", "name": INSTANCE, "namespace": names.system}],
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": INSTANCE, "namespace": names.system, "labels": labels},
            "spec": {
                "replicas": 1,
                "strategy": {"type": "Recreate"},
                "selector": {"matchLabels": {"app.kubernetes.io/name": INSTANCE}},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": INSTANCE,
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
        },
    ]


def _instance_pods(kube: Kube, names: Names) -> list[dict[str, Any]]:
    pods, _ = kube.list(
        "v1", "Pod", namespace=names.system, label_selector=f"app.kubernetes.io/name={INSTANCE}"
    )
    return pods


def _describe(kube: Kube, names: Names, plugin: e2e.HostPlugin) -> str:
    """What a failure message needs: the instance pods' state and events, the plugin log."""
    lines = []
    for pod in _instance_pods(kube, names):
        lines.append(f"pod {pod['metadata']['name']}: {pod.get('status')}")
    events, _ = kube.list("v1", "Event", namespace=names.system)
    lines += [f"event {e.get('reason')}: {e.get('message')}" for e in events]
    lines.append(f"plugin log (tail):\n{plugin.log()[-2000:]}")
    return "\n".join(lines)


@dataclass
class Running:
    objects: list[dict[str, Any]]


@pytest.fixture(scope="module")
def running(
    kube_cluster: Any,
    kube: Kube,
    names: Names,
    plugin: e2e.HostPlugin,
    bundle_image: str,
    provisioner_image: str,
) -> Iterator[Running]:
    """The instance Deployment applied; everything the test made removed afterwards."""
    objects = instance_objects(kube_cluster, names, image=provisioner_image, bundle=bundle_image)
    try:
        for obj in objects:
            kube.apply(obj)
        yield Running(objects)
    finally:
        for obj in reversed(objects[1:]):
            kube.delete(ObjectRef.of(obj))
        eventually(
            lambda: not _instance_pods(kube, names), timeout=60, what="the instance pod to go"
        )
        # NotFound when nothing was installed (an earlier failure): nothing to remove
        with contextlib.suppress(errors.NotFound):
            lifecycle.uninstall(kube, DEPLOYMENT, system_namespace=names.system)
        kube.delete(ObjectRef("", "v1", "Namespace", "", names.target))
        kube.delete(ObjectRef("", "v1", "Namespace", "", names.system))


def _lease_holder(kube: Kube, names: Names) -> str | None:
    ref = ObjectRef(
        "coordination.k8s.io", "v1", "Lease", names.system, lease.lease_name(DEPLOYMENT)
    )
    live = kube.get(ref)
    return None if live is None else str(live["spec"].get("holderIdentity") or "")


class TestTheInstancePod:
    """In file order: each test builds on the state the previous one left."""

    def test_it_applies_the_bundle_from_its_csi_volume_and_holds_the_lease(
        self, kube: Kube, names: Names, plugin: e2e.HostPlugin, running: Running
    ) -> None:
        greeting = ObjectRef("", "v1", "ConfigMap", names.target, GREETING)
        try:
            live = eventually(lambda: kube.get(greeting), timeout=120, what="hello-greeting")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{_describe(kube, names, plugin)}") from None
        assert live["metadata"]["labels"][OWNER_LABEL] == DEPLOYMENT
        for ref in (
            ObjectRef("", "v1", "Namespace", "", names.target),
            ObjectRef("apps", "v1", "Deployment", names.target, "hello"),
        ):
            obj = eventually(functools.partial(kube.get, ref), timeout=30, what=str(ref))
            assert obj["metadata"]["labels"][OWNER_LABEL] == DEPLOYMENT
        inv_ref = ObjectRef(
            "", "v1", "ConfigMap", names.system, inventory.configmap_name(DEPLOYMENT)
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
        assert restored["metadata"]["labels"][OWNER_LABEL] == DEPLOYMENT

    def test_deleting_the_instance_deployment_stops_the_pod_and_releases_the_lease(
        self, kube: Kube, names: Names, running: Running
    ) -> None:
        (pod,) = _instance_pods(kube, names)
        assert _lease_holder(kube, names) == pod["metadata"]["name"]
        deployment = next(o for o in running.objects if o["kind"] == "Deployment")
        assert kube.delete(ObjectRef.of(deployment))
        eventually(
            lambda: not _instance_pods(kube, names), timeout=60, what="the instance pod to go"
        )
        # only a release empties the holder: an expired Lease still names its holder
        assert _lease_holder(kube, names) == ""
