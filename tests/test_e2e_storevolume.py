"""End to end: a store volume on a real node, asked for content by digest.

The local cluster's kubelet and containerd, our plugin as a host process registered with
the kubelet (as in ``test_e2e_csi``), started with ``--store-volume-allow
<namespace>/store-reader``, and the ``CSIDriver`` object of
``storageclass/csidriver.yaml`` (``podInfoOnMount: true``). A pod running as
``store-reader`` mounts a ``kind: store`` volume with ``mountPropagation:
HostToContainer`` and waits for a digest to appear in it; the test asks for that digest
through ``rukpak.sources.storeclient`` on the volume's socket (at the target path the
kubelet gave the plugin) and the pod then reads the file through its own mount: the
digest's bind mount propagated into the running container. A pod running as ``default``
is refused: its FailedMount event says PermissionDenied.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from rukpak.sources.storeclient import StoreClient
from tests import e2e_helpers as e2e
from tests.csi_helpers import PushedImage, simple_image
from tests.polling import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

READER = "store-reader"


@pytest.fixture(scope="module")
def namespace(core: client.CoreV1Api) -> Iterator[str]:
    with e2e.temporary_namespace(core, "e2e-store") as name:
        core.create_namespaced_service_account(
            name, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=READER))
        )
        yield name


@dataclass
class StorePlugin(e2e.HostPlugin):
    allow: str = ""

    def argv(self) -> list[str]:
        return [*super().argv(), "--store-volume-allow", self.allow]


@pytest.fixture(scope="module")
def plugin(
    kube_cluster: Any, api_client: client.ApiClient, namespace: str
) -> Iterator[StorePlugin]:
    base = e2e.HostPlugin.for_cluster(kube_cluster)
    plugin = StorePlugin(
        kubelet_dir=base.kubelet_dir,
        registration_dir=base.registration_dir,
        plugins_dir=base.plugins_dir,
        node_id=base.node_id,
        allow=f"{namespace}/{READER}",
    )
    with plugin.registered(api_client) as started:
        yield started


@pytest.fixture(scope="module")
def image(kube_cluster: Any) -> PushedImage:
    return simple_image(kube_cluster.registry_host, "rukpak-e2e/storevol", text="read by digest")


def store_pod(cluster: Any, name: str, command: str, account: str) -> client.V1Pod:
    volume = client.V1Volume(
        name="bundle",
        csi=client.V1CSIVolumeSource(
            driver=e2e.DRIVER, read_only=True, volume_attributes={"kind": "store"}
        ),
    )
    pod = e2e.bundle_pod(name, image=str(cluster.busybox_image), command=command, volume=volume)
    pod.spec.service_account_name = account
    mounts: Any = pod.spec.containers[0].volume_mounts
    mounts[0].mount_propagation = "HostToContainer"
    return pod


def test_an_allowed_pod_reads_a_digest_it_asked_for_and_another_pod_is_refused(
    kube_cluster: Any,
    core: client.CoreV1Api,
    plugin: StorePlugin,
    namespace: str,
    image: PushedImage,
) -> None:
    digest = image.manifest_digest
    wanted = f"/bundle/{digest}/manifests/cm.yaml"
    reader = f"store-{uuid.uuid4().hex[:6]}"
    command = f"until [ -f {wanted} ]; do sleep 0.1; done; cat {wanted}"
    e2e.create_pod(core, namespace, store_pod(kube_cluster, reader, command, READER))
    refused = f"refused-{uuid.uuid4().hex[:6]}"
    e2e.create_pod(core, namespace, store_pod(kube_cluster, refused, "true", "default"))
    try:
        pod = e2e.wait_phase(core, namespace, reader, ("Running",), timeout=90)
        mount = e2e.csi_target_path(Path(kube_cluster.kubelet_dir), pod.metadata.uid, "bundle")
        ref = f"{image.ref.rsplit(':', 1)[0]}@{digest}"
        with StoreClient(mount, timeout=60) as store:
            assert store.fetch(ref) == mount / digest
        done = e2e.wait_phase(core, namespace, reader, ("Succeeded", "Failed"), timeout=60)
        log = core.read_namespaced_pod_log(reader, namespace)
        assert done.status.phase == "Succeeded", f"{log}\n{plugin.log()[-3000:]}"
        assert log == "read by digest"

        def permission_denied() -> list[str]:
            messages = e2e.failed_mount_messages(core, namespace, refused)
            return [m for m in messages if "PermissionDenied" in m]

        messages = eventually(permission_denied, timeout=60, what="a FailedMount event")
        assert "ServiceAccount default) may not mount a store volume" in messages[0]
        assert core.read_namespaced_pod(refused, namespace).status.phase == "Pending"
    finally:
        e2e.delete_pod_and_wait(core, namespace, reader)
        e2e.delete_pod_and_wait(core, namespace, refused)
    # kubelet tears the volume down after the pod is gone from the API: wait for it
    eventually(lambda: not mount.exists(), timeout=60, what="the store volume unpublished")
    assert "unpublished store volume" in plugin.log()
