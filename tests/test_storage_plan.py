"""The provisioner role's pure decisions: which claims, what CreateVolume gets, the PV body,
finalizers and deletion; quantities; event aggregation.

Pure logic on plain dicts, as the API server would send them; the role against the
real plugin and cluster is in ``tests/test_storage_provisioner.py`` and
``tests/test_e2e_storageclass.py``.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from provisioner.engine.objects import ObjectRef
from provisioner.storage import plan, quantity
from provisioner.storage.events import Recorder
from provisioner.storage.plan import Capability, SecretRef
from rukpak.common import errors
from tests.storage_helpers import DRIVER, UID, claim, storage_class


def secret_params(role: str, name: str, namespace: str) -> dict[str, str]:
    """A StorageClass's ``csi.storage.k8s.io/<role>-secret-name`` and ``-namespace``
    parameters (role: ``node-publish`` or ``provisioner``)."""
    prefix = f"csi.storage.k8s.io/{role}-secret"
    return {f"{prefix}-name": name, f"{prefix}-namespace": namespace}


# --- which claims ---------------------------------------------------------------------


def with_annotations(body: dict[str, Any], anns: dict[str, str]) -> dict[str, Any]:
    out = copy.deepcopy(body)
    out["metadata"]["annotations"] = anns
    return out


@pytest.mark.parametrize(
    ("case", "body", "cls", "wanted"),
    [
        ("annotated for us", claim(), storage_class(), True),
        (
            "beta annotation",
            with_annotations(claim(), {plan.ANN_BETA_STORAGE_PROVISIONER: DRIVER}),
            storage_class(),
            True,
        ),
        ("no annotation yet", with_annotations(claim(), {}), storage_class(), False),
        (
            "another driver",
            with_annotations(claim(), {plan.ANN_STORAGE_PROVISIONER: "ebs.csi.aws.com"}),
            storage_class(),
            False,
        ),
        ("already bound", claim(volumeName="pvc-other"), storage_class(), False),
        (
            "late binding without a node",
            claim(),
            storage_class(volumeBindingMode="WaitForFirstConsumer"),
            False,
        ),
        (
            "late binding with a node",
            with_annotations(
                claim(), {plan.ANN_STORAGE_PROVISIONER: DRIVER, plan.ANN_SELECTED_NODE: "n1"}
            ),
            storage_class(volumeBindingMode="WaitForFirstConsumer"),
            True,
        ),
    ],
)
def test_which_claims_are_provisioned(
    case: str, body: dict[str, Any], cls: dict[str, Any], wanted: bool
) -> None:
    assert plan.should_provision(body, cls, DRIVER) is wanted, case


def test_a_claim_being_deleted_is_not_provisioned() -> None:
    body = claim()
    body["metadata"]["deletionTimestamp"] = "2026-11-22T18:00:00Z"
    assert not plan.should_provision(body, storage_class(), DRIVER)


# --- the CreateVolume request ---------------------------------------------------------


def test_the_request_is_named_after_the_claim_uid_and_strips_reserved_parameters() -> None:
    cls = storage_class(
        parameters={
            "image": "registry.example/bundles/hello:v1",
            "pullPolicy": "Always",
            **secret_params("node-publish", "pull-${pvc.name}", "${pvc.namespace}"),
            **secret_params("provisioner", "resolver", "rukpak-system"),
        },
        mountOptions=["noatime"],
    )
    request = plan.create_request(claim(), cls, DRIVER)
    assert request.name == f"pvc-{UID}"
    assert request.parameters == {
        "image": "registry.example/bundles/hello:v1",
        "pullPolicy": "Always",
    }
    assert request.required_bytes == 1 << 20
    assert request.capabilities == (Capability("MULTI_NODE_READER_ONLY", mount_flags=("noatime",)),)
    assert request.node_publish_secret == SecretRef("pull-bundle", "apps")
    assert request.provisioner_secret == SecretRef("resolver", "rukpak-system")


@pytest.mark.parametrize(
    ("mode", "csi_mode"),
    [
        ("ReadWriteOnce", "SINGLE_NODE_WRITER"),
        ("ReadOnlyMany", "MULTI_NODE_READER_ONLY"),
        ("ReadWriteMany", "MULTI_NODE_MULTI_WRITER"),  # passed on: the plugin refuses it
        ("ReadWriteOncePod", "SINGLE_NODE_SINGLE_WRITER"),
    ],
)
def test_access_modes_map_to_csi_modes(mode: str, csi_mode: str) -> None:
    request = plan.create_request(claim(accessModes=[mode]), storage_class(), DRIVER)
    assert [c.mode for c in request.capabilities] == [csi_mode]


def test_a_block_claim_asks_for_block_access() -> None:
    request = plan.create_request(claim(volumeMode="Block"), storage_class(), DRIVER)
    assert request.capabilities == (Capability("MULTI_NODE_READER_ONLY", block=True),)


@pytest.mark.parametrize(
    ("case", "body", "cls", "words"),
    [
        ("selector", claim(selector={"matchLabels": {"a": "b"}}), storage_class(), "Selector"),
        (
            "data source",
            claim(dataSource={"kind": "PersistentVolumeClaim", "name": "x"}),
            storage_class(),
            "dataSource is not supported",
        ),
        ("no access modes", claim(accessModes=[]), storage_class(), "accessModes"),
        ("unknown access mode", claim(accessModes=["ReadSometimes"]), storage_class(), "Read"),
        (
            "malformed size",
            claim(resources={"requests": {"storage": "lots"}}),
            storage_class(),
            "not a quantity",
        ),
        (
            "size past int64",
            claim(resources={"requests": {"storage": "9Ei"}}),
            storage_class(),
            "larger than",
        ),
        (
            "reserved key",
            claim(),
            storage_class(parameters={"image": "x", "csi.storage.k8s.io/imagee": "y"}),
            'unknown parameter key "csi.storage.k8s.io/imagee"',
        ),
        (
            "secret name without namespace",
            claim(),
            storage_class(
                parameters={"image": "x", "csi.storage.k8s.io/node-publish-secret-name": "s"}
            ),
            "Both must be specified",
        ),
        (
            "secret name template with an unknown token",
            claim(),
            storage_class(
                parameters={
                    "image": "x",
                    **secret_params("node-publish", "${pvc.owner}", "ns"),
                }
            ),
            "invalid tokens",
        ),
        (
            "secret name that is no DNS name",
            claim(),
            storage_class(
                parameters={
                    "image": "x",
                    **secret_params("node-publish", "Not_A_Name", "ns"),
                }
            ),
            "not a valid secret name",
        ),
    ],
)
def test_claims_and_classes_the_role_cannot_serve_are_refused_with_the_reason(
    case: str, body: dict[str, Any], cls: dict[str, Any], words: str
) -> None:
    with pytest.raises(errors.InvalidArgument) as info:
        plan.create_request(body, cls, DRIVER)
    assert words in info.value.message, case


# --- the PV ---------------------------------------------------------------------------


def test_the_pv_is_bound_to_the_claim_and_carries_the_volume_context() -> None:
    cls = storage_class(
        parameters={
            "image": "registry.example/bundles/hello:v1",
            **secret_params("node-publish", "pull", "apps"),
        }
    )
    body = claim()
    request = plan.create_request(body, cls, DRIVER)
    context = {
        "image": "registry.example/bundles/hello@sha256:" + "a" * 64,
        "pullPolicy": "IfNotPresent",
    }
    pv = plan.persistent_volume(body, cls, request, plan.CreatedVolume("bundle-123", 0, context))
    assert pv == {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": f"pvc-{UID}",
            "annotations": {
                "pv.kubernetes.io/provisioned-by": DRIVER,
                "volume.kubernetes.io/provisioner-deletion-secret-name": "",
                "volume.kubernetes.io/provisioner-deletion-secret-namespace": "",
            },
            "finalizers": ["external-provisioner.volume.kubernetes.io/finalizer"],
        },
        "spec": {
            "accessModes": ["ReadOnlyMany"],
            "capacity": {"storage": "1Mi"},  # the driver reported 0: the requested size
            "csi": {
                "driver": DRIVER,
                "volumeHandle": "bundle-123",
                "volumeAttributes": context,
                "nodePublishSecretRef": {"name": "pull", "namespace": "apps"},
            },
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": "bundles",
            "volumeMode": "Filesystem",
            "claimRef": {
                "kind": "PersistentVolumeClaim",
                "apiVersion": "v1",
                "namespace": "apps",
                "name": "bundle",
                "uid": UID,
                "resourceVersion": "42",
            },
        },
    }


def test_a_retain_class_gives_a_pv_without_our_finalizer() -> None:
    cls = storage_class(reclaimPolicy="Retain")
    request = plan.create_request(claim(), cls, DRIVER)
    pv = plan.persistent_volume(claim(), cls, request, plan.CreatedVolume("v", 1 << 20, {}))
    assert pv["spec"]["persistentVolumeReclaimPolicy"] == "Retain"
    assert "finalizers" not in pv["metadata"]


def test_a_volume_smaller_than_requested_is_refused() -> None:
    request = plan.create_request(claim(), storage_class(), DRIVER)
    with pytest.raises(errors.RukpakError, match="less than requested capacity"):
        plan.persistent_volume(claim(), storage_class(), request, plan.CreatedVolume("v", 1, {}))


def test_the_provisioner_secret_is_remembered_for_deletion() -> None:
    cls = storage_class(
        parameters={
            "image": "x",
            **secret_params("provisioner", "resolver", "rukpak-system"),
        }
    )
    request = plan.create_request(claim(), cls, DRIVER)
    pv = plan.persistent_volume(claim(), cls, request, plan.CreatedVolume("v", 0, {}))
    assert plan.deletion_secret(pv) == SecretRef("resolver", "rukpak-system")


# --- PVs: ours, finalizers, deletion ------------------------------------------------


def pv(
    *, phase: str = "Bound", reclaim: str = "Delete", finalizers: list[str] | None = None,
    deleting: bool = False, provisioned_by: str | None = DRIVER, csi_driver: str = DRIVER,
) -> dict[str, Any]:  # fmt: skip
    meta: dict[str, Any] = {"name": "pvc-1", "resourceVersion": "7"}
    if provisioned_by is not None:
        meta["annotations"] = {plan.ANN_PROVISIONED_BY: provisioned_by}
    if finalizers is not None:
        meta["finalizers"] = finalizers
    if deleting:
        meta["deletionTimestamp"] = "2026-11-22T18:00:00Z"
    return {
        "metadata": meta,
        "spec": {
            "persistentVolumeReclaimPolicy": reclaim,
            "csi": {"driver": csi_driver, "volumeHandle": "bundle-1"},
        },
        "status": {"phase": phase},
    }


def test_which_pvs_are_ours() -> None:
    assert plan.is_ours(pv(), DRIVER)
    assert not plan.is_ours(pv(provisioned_by="ebs.csi.aws.com"), DRIVER)
    assert plan.is_ours(pv(provisioned_by=None), DRIVER)  # a static PV of our driver
    assert not plan.is_ours(pv(provisioned_by=None, csi_driver="other"), DRIVER)


F = plan.FINALIZER
PROTECTION = "kubernetes.io/pv-protection"


@pytest.mark.parametrize(
    ("case", "volume", "wanted"),
    [
        ("bound, Delete, missing", pv(finalizers=[PROTECTION]), [PROTECTION, F]),
        ("bound, Delete, present", pv(finalizers=[F]), None),
        ("Retain drops it", pv(reclaim="Retain", finalizers=[PROTECTION, F]), [PROTECTION]),
        ("Retain without it", pv(reclaim="Retain", finalizers=[PROTECTION]), None),
        ("not added while deleting", pv(finalizers=[], deleting=True), None),
        ("not added before Bound", pv(phase="Pending", finalizers=[]), None),
    ],
)
def test_our_finalizer_follows_the_reclaim_policy(
    case: str, volume: dict[str, Any], wanted: list[str] | None
) -> None:
    assert plan.finalizers_wanted(volume) == wanted, case


@pytest.mark.parametrize(
    ("case", "volume", "delete"),
    [
        ("released, Delete", pv(phase="Released", finalizers=[F]), True),
        (
            "released, Delete, being deleted",
            pv(phase="Released", finalizers=[F], deleting=True),
            True,
        ),
        ("released, Retain", pv(phase="Released", reclaim="Retain"), False),
        ("bound", pv(finalizers=[F]), False),
        (
            "finalizer gone while deleting",
            pv(phase="Released", finalizers=[], deleting=True),
            False,
        ),
    ],
)
def test_which_volumes_are_deleted(case: str, volume: dict[str, Any], delete: bool) -> None:
    assert plan.should_delete(volume) is delete, case


# --- quantities -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("1Gi", 1 << 30),
        ("500M", 500_000_000),
        ("1e3", 1000),
        ("1.5Ki", 1536),
        ("100m", 1),  # a tenth of a byte rounds up, as Quantity.Value() does
        ("0", 0),
        ("7", 7),
        ("8Ei", None),  # 2**63: one past int64
        ("-1", None),
        ("1Gb", None),
        ("", None),
        ("1e400", None),
    ],
)
def test_quantities(text: str, count: int | None) -> None:
    if count is None:
        with pytest.raises(errors.InvalidArgument):
            quantity.to_bytes(text)
    else:
        assert quantity.to_bytes(text) == count


@pytest.mark.parametrize(
    ("count", "text"), [(1 << 30, "1Gi"), (1536, "1536"), (3 << 20, "3Mi"), (0, "0")]
)
def test_capacities_are_written_in_binary_units(count: int, text: str) -> None:
    assert quantity.from_bytes(count) == text
    assert quantity.to_bytes(text) == count


# --- events ---------------------------------------------------------------------------


class Sink:
    """Records the Event writes a Recorder makes (a pure-logic stand-in for the API)."""

    def __init__(self) -> None:
        self.created: list[dict[str, Any]] = []
        self.patched: list[tuple[ObjectRef, dict[str, Any]]] = []

    def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.created.append(obj)
        return obj

    def merge_patch(self, ref: ObjectRef, patch: dict[str, Any]) -> dict[str, Any]:
        self.patched.append((ref, patch))
        return patch


def test_a_repeated_event_bumps_its_count_instead_of_adding_another() -> None:
    sink = Sink()
    recorder = Recorder(sink, component="csi.rukpak.io_test")
    for _ in range(3):
        recorder.event(claim(), "Warning", "ProvisioningFailed", "bad image")
    recorder.event(claim(), "Warning", "ProvisioningFailed", "another message")
    assert [e["message"] for e in sink.created] == ["bad image", "another message"]
    first = sink.created[0]
    assert first["involvedObject"]["uid"] == UID and first["metadata"]["namespace"] == "apps"
    assert [p["count"] for _, p in sink.patched] == [2, 3]
    assert {ref.name for ref, _ in sink.patched} == {first["metadata"]["name"]}


def test_events_of_cluster_scoped_volumes_go_to_the_default_namespace() -> None:
    sink = Sink()
    Recorder(sink, component="c").event(pv(), "Warning", "VolumeFailedDelete", "x" * 5000)
    (event,) = sink.created
    assert event["metadata"]["namespace"] == "default"
    assert len(event["message"]) <= 1024
