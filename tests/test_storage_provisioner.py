"""The provisioner role against the real plugin process, registry and API server.

``plan.create_request`` turns hostile claims and classes into requests, and the
real Controller service answers them over its unix socket: what comes back is
the ProvisioningFailed text a user reads in ``kubectl describe pvc``. Then the
whole role (``controller.VolumeProvisioner``) runs against kube-apiserver as the
shipped ServiceAccount with the shipped RBAC (``storageclass/controller-rbac.yaml``):
it provisions an annotated claim and deletes a Released volume, and keeps a
Retain one. The full flow with kube-controller-manager and the kubelet is
``tests/test_e2e_storageclass.py``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from csi.proto import csi_pb2, csi_pb2_grpc
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import ObjectRef
from provisioner.storage import controller, plan
from provisioner.storage import metrics as storage_metrics
from provisioner.storage.csiclient import CsiClient, CsiError
from provisioner.storage.events import Recorder
from rukpak.common import errors
from rukpak.common.backoff import Backoff
from rukpak.oci.auth import Credentials
from tests.csi_helpers import PluginProcess, mount_capability, push_image, simple_image
from tests.metrics_helpers import Samples, scrape
from tests.polling import eventually
from tests.registry import RegistryServer
from tests.storage_helpers import DRIVER, UID, claim, storage_class

pytestmark = [pytest.mark.registry]


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PluginProcess]:
    proc = PluginProcess(tmp_path_factory.mktemp("provisioner")).start()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def csi(plugin: PluginProcess) -> Iterator[CsiClient]:
    client = CsiClient(str(plugin.socket), timeout=30)
    try:
        yield client
    finally:
        client.close()


def test_connect_checks_the_driver_and_its_controller_service(csi: CsiClient) -> None:
    assert csi.connect(driver=DRIVER, wait=10) == DRIVER
    with pytest.raises(errors.FailedPrecondition, match=r"not 'other\.example\.com'"):
        csi.connect(driver="other.example.com", wait=10)


def test_connect_to_a_missing_socket_is_unavailable_and_says_what_to_check(
    tmp_path: Path,
) -> None:
    client = CsiClient(str(tmp_path / "none.sock"))
    try:
        with pytest.raises(errors.Unavailable, match="shares the socket volume"):
            client.connect(driver=DRIVER, wait=0)
    finally:
        client.close()


def test_a_claim_of_a_good_class_gets_a_volume_pinned_to_a_digest(
    csi: CsiClient, registry: RegistryServer
) -> None:
    image = simple_image(registry.host, "provisioner/hello")
    cls = storage_class(parameters={"image": image.ref, "pullPolicy": "IfNotPresent"})
    request = plan.create_request(claim(), cls, DRIVER)
    created = csi.create_volume(request, {})
    repository = image.ref.rsplit(":", 1)[0]
    assert created.volume_context == {
        "image": f"{repository}@{image.manifest_digest}",
        "pullPolicy": "IfNotPresent",
    }
    pv = plan.persistent_volume(claim(), cls, request, created)
    assert pv["metadata"]["name"] == f"pvc-{UID}"
    assert pv["spec"]["capacity"] == {"storage": "1Mi"}
    assert pv["spec"]["csi"]["volumeHandle"] == created.volume_id
    csi.delete_volume(created.volume_id, {})
    csi.delete_volume(created.volume_id, {})  # idempotent


BAD: dict[str, tuple[dict[str, Any], dict[str, str], str]] = {
    "missing image": (
        {},
        {"pullPolicy": "Always"},
        "volume attribute 'image' is required",
    ),
    "unknown attribute": ({}, {"image": "IMAGE", "imagePullPolicy": "Always"}, "imagePullPolicy"),
    "bad pullPolicy": ({}, {"image": "IMAGE", "pullPolicy": "Sometimes"}, "Sometimes"),
    "read-write-many claim": (
        {"accessModes": ["ReadWriteMany"]},
        {"image": "IMAGE"},
        "MULTI_NODE_MULTI_WRITER is not supported",
    ),
    "block claim": ({"volumeMode": "Block"}, {"image": "IMAGE"}, "raw block access"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_what_the_plugin_refuses_comes_back_as_invalid_argument_saying_what_to_fix(
    csi: CsiClient, registry: RegistryServer, case: str
) -> None:
    image = simple_image(registry.host, "provisioner/hello")
    claim_spec, params, words = BAD[case]
    params = {k: (image.ref if v == "IMAGE" else v) for k, v in params.items()}
    body = claim(**claim_spec)
    request = plan.create_request(body, storage_class(parameters=params), DRIVER)
    with pytest.raises(CsiError) as info:
        csi.create_volume(request, {})
    assert info.value.status == grpc.StatusCode.INVALID_ARGUMENT
    assert str(info.value).startswith("rpc error: code = InvalidArgument desc = ")
    assert words in str(info.value)


def test_a_huge_claim_is_recorded_with_its_size(csi: CsiClient, registry: RegistryServer) -> None:
    image = simple_image(registry.host, "provisioner/hello")
    body = claim(resources={"requests": {"storage": "7Ei"}})
    body["metadata"]["uid"] = "huge"
    request = plan.create_request(body, storage_class(parameters={"image": image.ref}), DRIVER)
    created = csi.create_volume(request, {})
    assert created.capacity_bytes == 7 << 60


# --- the whole role against a real API server -------------------------------------------
#
# kube-apiserver only (no kube-controller-manager): the test does what the PV controller
# would (annotate claims for our driver, set PV phases) and checks what the role does
# in answer, running as the shipped ServiceAccount with the shipped RBAC.

RBAC = Path(__file__).resolve().parent.parent / "storageclass" / "controller-rbac.yaml"


def shipped_rbac(namespace: str, suffix: str) -> list[dict[str, Any]]:
    docs = []
    for doc in yaml.safe_load_all(RBAC.read_text()):
        doc = json.loads(json.dumps(doc).replace('"rukpak-system"', f'"{namespace}"'))
        if doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            doc["metadata"]["name"] += f"-{suffix}"
        if doc["kind"] == "ClusterRoleBinding":
            doc["roleRef"]["name"] += f"-{suffix}"
        docs.append(doc)
    return docs


@dataclass
class Role:
    provisioner: controller.VolumeProvisioner
    admin: Kube
    namespace: str
    suffix: str
    metrics_port: int

    def samples(self) -> Samples:
        """A scrape of the role's ``/metrics`` over HTTP."""
        return scrape(self.metrics_port)


@pytest.fixture
def role(kube: Kube, kube_apiserver: Any, plugin: PluginProcess, name: str) -> Iterator[Role]:
    suffix = name.rsplit("-", 1)[-1]
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    for doc in shipped_rbac(name, suffix):
        kube.apply(doc)
    sa = Kube.from_kubeconfig(str(kube_apiserver.kubeconfig))
    sa._api.set_default_header(  # type: ignore[no-untyped-call]
        "Impersonate-User", f"system:serviceaccount:{name}:rukpak-csi-controller"
    )
    csi = CsiClient(str(plugin.socket), timeout=30)
    metrics = storage_metrics.Metrics(driver_name=DRIVER)
    provisioner = controller.VolumeProvisioner(
        sa,
        csi,
        driver=DRIVER,
        recorder=Recorder(sa, component=f"{DRIVER}_test"),
        backoff=Backoff(base=0.2, cap=2.0),
        watch_timeout=20,
        metrics=metrics,
    )
    server = storage_metrics.serve(metrics, host="127.0.0.1", port=0)
    provisioner.start(workers=1)
    try:
        yield Role(provisioner, kube, name, suffix, int(server.server_address[1]))
    finally:
        server.shutdown()
        server.server_close()
        provisioner.stop()
        csi.close()
        sa.close()
        for doc in shipped_rbac(name, suffix):
            if doc["kind"].startswith("Cluster"):
                kube.delete(ObjectRef.of(doc))


def api_class(role: Role, cls: str, image: str, reclaim: str = "Delete") -> None:
    role.admin.create(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": cls},
            "provisioner": DRIVER,
            "reclaimPolicy": reclaim,
            "parameters": {"image": image},
        }
    )


def api_claim(role: Role, claim_name: str, cls: str) -> dict[str, Any]:
    """A claim as the PV controller leaves it for an external provisioner: annotated."""
    return role.admin.create(
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {
                "name": claim_name,
                "namespace": role.namespace,
                "annotations": {plan.ANN_STORAGE_PROVISIONER: DRIVER},
            },
            "spec": {
                "accessModes": ["ReadOnlyMany"],
                "storageClassName": cls,
                "resources": {"requests": {"storage": "2Mi"}},
            },
        }
    )


def pv_ref(pv_name: str) -> ObjectRef:
    return ObjectRef("", "v1", "PersistentVolume", "", pv_name)


def set_phase(role: Role, pv_name: str, phase: str) -> None:
    role.admin.merge_patch_status(pv_ref(pv_name), {"status": {"phase": phase}})


@pytest.mark.cluster
def test_the_role_provisions_a_claim_and_deletes_the_released_volume(
    role: Role, registry: RegistryServer, plugin: PluginProcess
) -> None:
    image = simple_image(registry.host, "provisioner/role")
    cls = f"role-{role.suffix}"
    api_class(role, cls, image.ref)
    created = api_claim(role, "bundle", cls)
    pv_name = f"pvc-{created['metadata']['uid']}"
    pv = eventually(lambda: role.admin.get(pv_ref(pv_name)), timeout=30, what="the PV")
    assert pv["spec"]["claimRef"]["uid"] == created["metadata"]["uid"]
    assert pv["spec"]["capacity"] == {"storage": "2Mi"}
    assert pv["spec"]["csi"]["volumeAttributes"]["image"].endswith("@" + image.manifest_digest)
    # kubernetes.io/pv-protection comes from the API server's admission; ours from the role
    assert plan.FINALIZER in pv["metadata"]["finalizers"]
    events, _ = role.admin.list("v1", "Event", namespace=role.namespace)
    reasons = {e["reason"] for e in events if e["involvedObject"]["name"] == "bundle"}
    assert "ProvisioningSucceeded" in reasons

    set_phase(role, pv_name, "Bound")
    role.admin.delete(ObjectRef("", "v1", "PersistentVolumeClaim", role.namespace, "bundle"))
    set_phase(role, pv_name, "Released")

    def deleted() -> bool:
        # without kube-controller-manager, kubernetes.io/pv-protection is never removed:
        # the PV stays Terminating once the role has deleted it and dropped its finalizer
        live = role.admin.get(pv_ref(pv_name))
        return live is None or (
            bool(live["metadata"].get("deletionTimestamp"))
            and plan.FINALIZER not in live["metadata"].get("finalizers", [])
        )

    eventually(deleted, timeout=30, what="the PV deleted and our finalizer dropped")
    # DeleteVolume reached the plugin for this volume: it no longer knows the id
    with grpc.insecure_channel(f"unix://{plugin.socket}") as channel:
        stub = csi_pb2_grpc.ControllerStub(channel)
        request = csi_pb2.ValidateVolumeCapabilitiesRequest(
            volume_id=pv["spec"]["csi"]["volumeHandle"],
            volume_capabilities=[mount_capability()],
        )
        with pytest.raises(grpc.RpcError) as info:
            stub.ValidateVolumeCapabilities(request, timeout=10)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    # and its metrics counted both, by StorageClass, and the CSI calls by method and code
    got = role.samples()
    by_class = (("class", cls),)
    # (a claim synced again before its PV reached the cache is counted again: >= 1)
    assert got[("controller_persistentvolumeclaim_provision_total", by_class)] >= 1
    assert got[("controller_persistentvolumeclaim_provision_duration_seconds_count", by_class)] >= 1
    assert got[("controller_persistentvolume_delete_total", by_class)] >= 1
    assert ("controller_persistentvolumeclaim_provision_failed_total", by_class) not in got
    call = (("driver_name", DRIVER), ("grpc_status_code", "OK"))
    for method in ("CreateVolume", "DeleteVolume"):
        labels = (*call, ("method_name", f"/csi.v1.Controller/{method}"))
        assert got[("csi_sidecar_operations_seconds_count", labels)] >= 1, method


@pytest.mark.cluster
def test_a_retained_volume_loses_our_finalizer_and_stays(
    role: Role, registry: RegistryServer
) -> None:
    image = simple_image(registry.host, "provisioner/role")
    cls = f"keep-{role.suffix}"
    api_class(role, cls, image.ref, reclaim="Retain")
    created = api_claim(role, "kept", cls)
    pv_name = f"pvc-{created['metadata']['uid']}"
    pv = eventually(lambda: role.admin.get(pv_ref(pv_name)), timeout=30, what="the PV")
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    finalizers = pv["metadata"].get("finalizers", [])
    assert plan.FINALIZER not in finalizers
    # as if an admin had switched the policy back and forth: our finalizer is on it
    role.admin.merge_patch(
        pv_ref(pv_name), {"metadata": {"finalizers": [*finalizers, plan.FINALIZER]}}
    )
    set_phase(role, pv_name, "Released")

    def finalizer_dropped() -> bool:
        live = role.admin.get(pv_ref(pv_name))
        return live is not None and plan.FINALIZER not in live["metadata"].get("finalizers", [])

    eventually(finalizer_dropped, timeout=30, what="our finalizer to be dropped from the PV")
    # One worker: the sync that dropped the finalizer (and would have deleted the volume
    # right after) has ended once the worker provisions the next claim.
    later = api_claim(role, "later", cls)
    eventually(
        lambda: role.admin.get(pv_ref(f"pvc-{later['metadata']['uid']}")),
        timeout=30,
        what="the next claim's PV",
    )
    kept = role.admin.get(pv_ref(pv_name))
    assert kept is not None and not kept["metadata"].get("deletionTimestamp")


@pytest.mark.cluster
def test_a_private_image_is_resolved_with_the_provisioner_secret_of_the_class(
    role: Role, auth_registry: RegistryServer
) -> None:
    assert auth_registry.username and auth_registry.password
    auth = base64.b64encode(f"{auth_registry.username}:{auth_registry.password}".encode())
    config = json.dumps({"auths": {auth_registry.host: {"auth": auth.decode()}}})
    image = push_image(
        auth_registry.host,
        "provisioner/private",
        "v1",
        [[("manifests/", "dir"), ("manifests/cm.yaml", "file", b"kind: ConfigMap")]],
        credentials=Credentials.from_dockerconfigjson(config),
    )
    role.admin.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "pull", "namespace": role.namespace},
            "type": "kubernetes.io/dockerconfigjson",
            "data": {".dockerconfigjson": base64.b64encode(config.encode()).decode()},
        }
    )
    cls = f"private-{role.suffix}"
    role.admin.create(
        {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": cls},
            "provisioner": DRIVER,
            "parameters": {
                "image": image.ref,
                "csi.storage.k8s.io/provisioner-secret-name": "pull",
                "csi.storage.k8s.io/provisioner-secret-namespace": role.namespace,
                "csi.storage.k8s.io/node-publish-secret-name": "pull",
                "csi.storage.k8s.io/node-publish-secret-namespace": "${pvc.namespace}",
            },
        }
    )
    created = api_claim(role, "private", cls)
    pv_name = f"pvc-{created['metadata']['uid']}"
    pv = eventually(lambda: role.admin.get(pv_ref(pv_name)), timeout=30, what="the PV")
    repository = image.ref.rsplit(":", 1)[0]
    csi = pv["spec"]["csi"]
    assert csi["volumeAttributes"]["image"] == f"{repository}@{image.manifest_digest}"
    assert csi["nodePublishSecretRef"] == {"name": "pull", "namespace": role.namespace}
    annotations = pv["metadata"]["annotations"]
    assert annotations[plan.ANN_DELETION_SECRET_NAME] == "pull"
    assert annotations[plan.ANN_DELETION_SECRET_NAMESPACE] == role.namespace
