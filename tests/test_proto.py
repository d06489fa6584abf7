"""The generated protocol stubs match the published specs, and secrets stay out of logs.

Field numbers, enum values and method paths are wire facts: a wrong one breaks
kubelet or csi-sanity in ways that are slow to debug, so a table of them taken
from the CSI spec v1.12.0 and kubelet's pluginregistration v1 api.proto is
checked against the generated descriptors here.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor, wrappers_pb2

from csi.common import logredact
from csi.proto import csi_pb2, csi_pb2_grpc, pluginregistration_pb2

# ------------------------------------------------------------ descriptors


def _message(module: object, dotted: str) -> descriptor.Descriptor:
    """Look up a (possibly nested) message type, e.g. ``VolumeCapability.MountVolume``."""
    file_desc: descriptor.FileDescriptor = module.DESCRIPTOR  # type: ignore[attr-defined]
    first, *rest = dotted.split(".")
    desc = file_desc.message_types_by_name[first]
    for name in rest:
        desc = desc.nested_types_by_name[name]
    return desc


def _options_set(options: object) -> set[str]:
    """Full names of the custom options set to true on a descriptor's options."""
    return {
        field.full_name
        for field, value in options.ListFields()  # type: ignore[attr-defined]
        if value is True
    }


FIELD_NUMBERS = [
    # Identity
    ("GetPluginInfoResponse", {"name": 1, "vendor_version": 2, "manifest": 3}),
    ("GetPluginCapabilitiesResponse", {"capabilities": 1}),
    ("PluginCapability", {"service": 1, "volume_expansion": 2}),
    ("PluginCapability.Service", {"type": 1}),
    ("ProbeResponse", {"ready": 1}),
    # Controller
    (
        "CreateVolumeRequest",
        {
            "name": 1,
            "capacity_range": 2,
            "volume_capabilities": 3,
            "parameters": 4,
            "secrets": 5,
            "volume_content_source": 6,
            "accessibility_requirements": 7,
            "mutable_parameters": 8,
        },
    ),
    ("CreateVolumeResponse", {"volume": 1}),
    (
        "Volume",
        {
            "capacity_bytes": 1,
            "volume_id": 2,
            "volume_context": 3,
            "content_source": 4,
            "accessible_topology": 5,
        },
    ),
    ("VolumeCapability", {"block": 1, "mount": 2, "access_mode": 3}),
    ("VolumeCapability.MountVolume", {"fs_type": 1, "mount_flags": 2, "volume_mount_group": 3}),
    ("VolumeCapability.AccessMode", {"mode": 1}),
    ("VolumeContentSource", {"snapshot": 1, "volume": 2}),
    ("CapacityRange", {"required_bytes": 1, "limit_bytes": 2}),
    ("TopologyRequirement", {"requisite": 1, "preferred": 2}),
    ("Topology", {"segments": 1}),
    ("DeleteVolumeRequest", {"volume_id": 1, "secrets": 2}),
    (
        "ValidateVolumeCapabilitiesRequest",
        {
            "volume_id": 1,
            "volume_context": 2,
            "volume_capabilities": 3,
            "parameters": 4,
            "secrets": 5,
            "mutable_parameters": 6,
        },
    ),
    ("ValidateVolumeCapabilitiesResponse", {"confirmed": 1, "message": 2}),
    (
        "ValidateVolumeCapabilitiesResponse.Confirmed",
        {"volume_context": 1, "volume_capabilities": 2, "parameters": 3, "mutable_parameters": 4},
    ),
    ("ControllerModifyVolumeRequest", {"volume_id": 1, "secrets": 2, "mutable_parameters": 3}),
    (
        "GetCapacityResponse",
        {"available_capacity": 1, "maximum_volume_size": 2, "minimum_volume_size": 3},
    ),
    (
        "Snapshot",
        {
            "size_bytes": 1,
            "snapshot_id": 2,
            "source_volume_id": 3,
            "creation_time": 4,
            "ready_to_use": 5,
            "group_snapshot_id": 6,
        },
    ),
    # Node
    (
        "NodePublishVolumeRequest",
        {
            "volume_id": 1,
            "publish_context": 2,
            "staging_target_path": 3,
            "target_path": 4,
            "volume_capability": 5,
            "readonly": 6,
            "secrets": 7,
            "volume_context": 8,
        },
    ),
    ("NodeUnpublishVolumeRequest", {"volume_id": 1, "target_path": 2}),
    (
        "NodeStageVolumeRequest",
        {
            "volume_id": 1,
            "publish_context": 2,
            "staging_target_path": 3,
            "volume_capability": 4,
            "secrets": 5,
            "volume_context": 6,
        },
    ),
    ("NodeGetVolumeStatsRequest", {"volume_id": 1, "volume_path": 2, "staging_target_path": 3}),
    ("NodeGetVolumeStatsResponse", {"usage": 1, "volume_condition": 2}),
    ("VolumeUsage", {"available": 1, "total": 2, "used": 3, "unit": 4}),
    ("VolumeCondition", {"abnormal": 1, "message": 2}),
    ("NodeGetInfoResponse", {"node_id": 1, "max_volumes_per_node": 2, "accessible_topology": 3}),
    ("NodeServiceCapability", {"rpc": 1}),
    (
        "NodeExpandVolumeRequest",
        {
            "volume_id": 1,
            "volume_path": 2,
            "capacity_range": 3,
            "staging_target_path": 4,
            "volume_capability": 5,
            "secrets": 6,
        },
    ),
    # SnapshotMetadata
    (
        "GetMetadataDeltaRequest",
        {
            "base_snapshot_id": 1,
            "target_snapshot_id": 2,
            "starting_offset": 3,
            "max_results": 4,
            "secrets": 5,
        },
    ),
]


@pytest.mark.parametrize(("message", "numbers"), FIELD_NUMBERS, ids=[m for m, _ in FIELD_NUMBERS])
def test_csi_field_numbers_match_the_spec(message: str, numbers: dict[str, int]) -> None:
    desc = _message(csi_pb2, message)
    assert {f.name: f.number for f in desc.fields} == numbers


ENUM_VALUES = [
    (
        "VolumeCapability.AccessMode.Mode",
        {
            "UNKNOWN": 0,
            "SINGLE_NODE_WRITER": 1,
            "SINGLE_NODE_READER_ONLY": 2,
            "MULTI_NODE_READER_ONLY": 3,
            "MULTI_NODE_SINGLE_WRITER": 4,
            "MULTI_NODE_MULTI_WRITER": 5,
            "SINGLE_NODE_SINGLE_WRITER": 6,
            "SINGLE_NODE_MULTI_WRITER": 7,
        },
    ),
    (
        "NodeServiceCapability.RPC.Type",
        {
            "UNKNOWN": 0,
            "STAGE_UNSTAGE_VOLUME": 1,
            "GET_VOLUME_STATS": 2,
            "EXPAND_VOLUME": 3,
            "VOLUME_CONDITION": 4,
            "SINGLE_NODE_MULTI_WRITER": 5,
            "VOLUME_MOUNT_GROUP": 6,
        },
    ),
    (
        "ControllerServiceCapability.RPC.Type",
        {
            "UNKNOWN": 0,
            "CREATE_DELETE_VOLUME": 1,
            "PUBLISH_UNPUBLISH_VOLUME": 2,
            "LIST_VOLUMES": 3,
            "GET_CAPACITY": 4,
            "CREATE_DELETE_SNAPSHOT": 5,
            "LIST_SNAPSHOTS": 6,
            "CLONE_VOLUME": 7,
            "PUBLISH_READONLY": 8,
            "EXPAND_VOLUME": 9,
            "LIST_VOLUMES_PUBLISHED_NODES": 10,
            "VOLUME_CONDITION": 11,
            "GET_VOLUME": 12,
            "SINGLE_NODE_MULTI_WRITER": 13,
            "MODIFY_VOLUME": 14,
            "GET_SNAPSHOT": 15,
        },
    ),
    (
        "PluginCapability.Service.Type",
        {
            "UNKNOWN": 0,
            "CONTROLLER_SERVICE": 1,
            "VOLUME_ACCESSIBILITY_CONSTRAINTS": 2,
            "GROUP_CONTROLLER_SERVICE": 3,
            "SNAPSHOT_METADATA_SERVICE": 4,
        },
    ),
    ("PluginCapability.VolumeExpansion.Type", {"UNKNOWN": 0, "ONLINE": 1, "OFFLINE": 2}),
    ("VolumeUsage.Unit", {"UNKNOWN": 0, "BYTES": 1, "INODES": 2}),
    (
        "GroupControllerServiceCapability.RPC.Type",
        {"UNKNOWN": 0, "CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT": 1},
    ),
]


@pytest.mark.parametrize(("enum", "values"), ENUM_VALUES, ids=[e for e, _ in ENUM_VALUES])
def test_csi_enum_values_match_the_spec(enum: str, values: dict[str, int]) -> None:
    *owner, name = enum.split(".")
    desc = _message(csi_pb2, ".".join(owner)).enum_types_by_name[name]
    assert {v.name: v.number for v in desc.values} == values


def test_the_top_level_block_metadata_type_enum_matches_the_spec() -> None:
    desc = csi_pb2.DESCRIPTOR.enum_types_by_name["BlockMetadataType"]
    assert {v.name: v.number for v in desc.values} == {
        "UNKNOWN": 0,
        "FIXED_LENGTH": 1,
        "VARIABLE_LENGTH": 2,
    }


@pytest.mark.parametrize(
    ("message", "oneof", "fields"),
    [
        ("VolumeCapability", "access_type", ["block", "mount"]),
        ("PluginCapability", "type", ["service", "volume_expansion"]),
        ("VolumeContentSource", "type", ["snapshot", "volume"]),
        ("NodeServiceCapability", "type", ["rpc"]),
        ("ControllerServiceCapability", "type", ["rpc"]),
    ],
)
def test_csi_oneofs_group_the_spec_fields(message: str, oneof: str, fields: list[str]) -> None:
    desc = _message(csi_pb2, message).oneofs_by_name[oneof]
    assert [f.name for f in desc.fields] == fields


def test_csi_file_keeps_the_spec_package_and_go_package() -> None:
    assert csi_pb2.DESCRIPTOR.package == "csi.v1"
    assert (
        csi_pb2.DESCRIPTOR.GetOptions().go_package
        == "github.com/container-storage-interface/spec/lib/go/csi"
    )


@pytest.mark.parametrize(
    ("extension", "number", "extends"),
    [
        ("csi_secret", 1059, "google.protobuf.FieldOptions"),
        ("alpha_field", 1060, "google.protobuf.FieldOptions"),
        ("alpha_enum", 1060, "google.protobuf.EnumOptions"),
        ("alpha_enum_value", 1060, "google.protobuf.EnumValueOptions"),
        ("alpha_message", 1060, "google.protobuf.MessageOptions"),
        ("alpha_method", 1060, "google.protobuf.MethodOptions"),
        ("alpha_service", 1060, "google.protobuf.ServiceOptions"),
    ],
)
def test_custom_options_have_the_spec_numbers(extension: str, number: int, extends: str) -> None:
    ext = csi_pb2.DESCRIPTOR.extensions_by_name[extension]
    assert ext.containing_type is not None
    assert (ext.number, ext.containing_type.full_name) == (number, extends)


def test_plugin_registration_matches_kubelets_api() -> None:
    file_desc = pluginregistration_pb2.DESCRIPTOR
    assert file_desc.package == "pluginregistration"
    fields = {
        name: {f.name: f.number for f in desc.fields}
        for name, desc in file_desc.message_types_by_name.items()
    }
    assert fields == {
        "PluginInfo": {"type": 1, "name": 2, "endpoint": 3, "supported_versions": 4},
        "RegistrationStatus": {"plugin_registered": 1, "error": 2},
        "RegistrationStatusResponse": {},
        "InfoRequest": {},
    }
    supported = file_desc.message_types_by_name["PluginInfo"].fields_by_name["supported_versions"]
    assert supported.is_repeated


# ---------------------------------------------------------------- options


def _all_fields(desc: descriptor.Descriptor) -> Iterator[descriptor.FieldDescriptor]:
    yield from desc.fields
    for nested in desc.nested_types:
        yield from _all_fields(nested)


def _every_csi_field() -> list[descriptor.FieldDescriptor]:
    return [
        field
        for message in csi_pb2.DESCRIPTOR.message_types_by_name.values()
        for field in _all_fields(message)
    ]


def test_every_secrets_field_and_only_those_carry_csi_secret() -> None:
    secret = {f.full_name for f in _every_csi_field() if logredact.is_secret(f)}
    named_secrets = {f.full_name for f in _every_csi_field() if f.name == "secrets"}
    assert secret == named_secrets
    assert "csi.v1.NodePublishVolumeRequest.secrets" in secret
    assert "csi.v1.CreateVolumeRequest.secrets" in secret
    assert len(secret) == 19


def test_node_expand_secrets_are_both_secret_and_alpha() -> None:
    field = csi_pb2.NodeExpandVolumeRequest.DESCRIPTOR.fields_by_name["secrets"]
    assert _options_set(field.GetOptions()) == {"csi.v1.csi_secret", "csi.v1.alpha_field"}


def test_alpha_markers_sit_where_the_spec_puts_them() -> None:
    mode = csi_pb2.VolumeCapability.AccessMode.Mode.DESCRIPTOR
    assert _options_set(mode.values_by_name["SINGLE_NODE_SINGLE_WRITER"].GetOptions()) == {
        "csi.v1.alpha_enum_value"
    }
    assert _options_set(mode.values_by_name["MULTI_NODE_READER_ONLY"].GetOptions()) == set()
    controller = csi_pb2.DESCRIPTOR.services_by_name["Controller"]
    assert _options_set(controller.methods_by_name["GetSnapshot"].GetOptions()) == {
        "csi.v1.alpha_method"
    }
    assert _options_set(controller.methods_by_name["ControllerModifyVolume"].GetOptions()) == set()
    metadata = csi_pb2.DESCRIPTOR.services_by_name["SnapshotMetadata"]
    assert _options_set(metadata.GetOptions()) == {"csi.v1.alpha_service"}
    assert _options_set(csi_pb2.VolumeCondition.DESCRIPTOR.GetOptions()) == {"csi.v1.alpha_message"}


# --------------------------------------------------------------- services


SERVICE_METHODS = [
    (csi_pb2, "Identity", ["GetPluginInfo", "GetPluginCapabilities", "Probe"]),
    (
        csi_pb2,
        "Controller",
        [
            "CreateVolume",
            "DeleteVolume",
            "ControllerPublishVolume",
            "ControllerUnpublishVolume",
            "ValidateVolumeCapabilities",
            "ListVolumes",
            "GetCapacity",
            "ControllerGetCapabilities",
            "CreateSnapshot",
            "DeleteSnapshot",
            "ListSnapshots",
            "GetSnapshot",
            "ControllerExpandVolume",
            "ControllerGetVolume",
            "ControllerModifyVolume",
        ],
    ),
    (
        csi_pb2,
        "GroupController",
        [
            "GroupControllerGetCapabilities",
            "CreateVolumeGroupSnapshot",
            "DeleteVolumeGroupSnapshot",
            "GetVolumeGroupSnapshot",
        ],
    ),
    (csi_pb2, "SnapshotMetadata", ["GetMetadataAllocated", "GetMetadataDelta"]),
    (
        csi_pb2,
        "Node",
        [
            "NodeStageVolume",
            "NodeUnstageVolume",
            "NodePublishVolume",
            "NodeUnpublishVolume",
            "NodeGetVolumeStats",
            "NodeExpandVolume",
            "NodeGetCapabilities",
            "NodeGetInfo",
        ],
    ),
    (pluginregistration_pb2, "Registration", ["GetInfo", "NotifyRegistrationStatus"]),
]


@pytest.mark.parametrize(
    ("module", "service", "methods"), SERVICE_METHODS, ids=[s for _, s, _ in SERVICE_METHODS]
)
def test_services_have_the_spec_methods_in_order(
    module: object, service: str, methods: list[str]
) -> None:
    file_desc: descriptor.FileDescriptor = module.DESCRIPTOR  # type: ignore[attr-defined]
    desc = file_desc.services_by_name[service]
    assert [m.name for m in desc.methods] == methods


def test_method_paths_are_the_ones_kubelet_calls() -> None:
    node = csi_pb2.DESCRIPTOR.services_by_name["Node"]
    assert node.full_name == "csi.v1.Node"
    assert node.methods_by_name["NodePublishVolume"].input_type.full_name == (
        "csi.v1.NodePublishVolumeRequest"
    )
    registration = pluginregistration_pb2.DESCRIPTOR.services_by_name["Registration"]
    assert registration.full_name == "pluginregistration.Registration"


def test_snapshot_metadata_rpcs_stream_their_responses() -> None:
    metadata = csi_pb2.DESCRIPTOR.services_by_name["SnapshotMetadata"]
    for method in metadata.methods:
        assert method.server_streaming and not method.client_streaming


class _Identity(csi_pb2_grpc.IdentityServicer):
    def GetPluginInfo(
        self, request: csi_pb2.GetPluginInfoRequest, context: grpc.ServicerContext
    ) -> csi_pb2.GetPluginInfoResponse:
        return csi_pb2.GetPluginInfoResponse(name="bundles.rukpak.io", vendor_version="test")


@pytest.fixture
def identity_channel(tmp_path: Path) -> Iterator[grpc.Channel]:
    address = f"unix://{tmp_path}/csi.sock"
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    csi_pb2_grpc.add_IdentityServicer_to_server(_Identity(), server)
    server.add_insecure_port(address)
    server.start()
    try:
        with grpc.insecure_channel(address) as channel:
            yield channel
    finally:
        server.stop(grace=None)


def test_a_generated_servicer_answers_over_a_unix_socket(identity_channel: grpc.Channel) -> None:
    stub = csi_pb2_grpc.IdentityStub(identity_channel)
    info = stub.GetPluginInfo(csi_pb2.GetPluginInfoRequest(), timeout=10)
    assert (info.name, info.vendor_version) == ("bundles.rukpak.io", "test")


def test_rpcs_a_servicer_leaves_out_answer_unimplemented(identity_channel: grpc.Channel) -> None:
    stub = csi_pb2_grpc.IdentityStub(identity_channel)
    with pytest.raises(grpc.RpcError) as raised:
        stub.Probe(csi_pb2.ProbeRequest(), timeout=10)
    assert raised.value.code() == grpc.StatusCode.UNIMPLEMENTED  # type: ignore[attr-defined]


# -------------------------------------------------------------- redaction

SECRET = "s3cr3t-token-value"


def _publish_request() -> csi_pb2.NodePublishVolumeRequest:
    return csi_pb2.NodePublishVolumeRequest(
        volume_id="csi-abc",
        target_path="/var/lib/kubelet/pods/uid/volumes/kubernetes.io~csi/bundle/mount",
        volume_capability=csi_pb2.VolumeCapability(
            mount=csi_pb2.VolumeCapability.MountVolume(),
            access_mode=csi_pb2.VolumeCapability.AccessMode(
                mode=csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_READER_ONLY
            ),
        ),
        readonly=True,
        secrets={".dockerconfigjson": SECRET},
        volume_context={"image": "quay.io/example/bundle:v1", "pullPolicy": "IfNotPresent"},
    )


def test_redaction_masks_node_publish_secrets_and_keeps_the_rest() -> None:
    assert logredact.redact(_publish_request()) == {
        "volume_id": "csi-abc",
        "target_path": "/var/lib/kubelet/pods/uid/volumes/kubernetes.io~csi/bundle/mount",
        "volume_capability": {
            "mount": {},
            "access_mode": {"mode": "SINGLE_NODE_READER_ONLY"},
        },
        "readonly": True,
        "secrets": "***",
        "volume_context": {"image": "quay.io/example/bundle:v1", "pullPolicy": "IfNotPresent"},
    }


def test_redaction_masks_create_volume_secrets_and_keeps_the_rest() -> None:
    request = csi_pb2.CreateVolumeRequest(
        name="pvc-1234",
        capacity_range=csi_pb2.CapacityRange(required_bytes=2**40),
        volume_capabilities=[_publish_request().volume_capability],
        parameters={"image": "quay.io/example/bundle:v1"},
        secrets={"username": "robot", "password": SECRET},
        accessibility_requirements=csi_pb2.TopologyRequirement(
            requisite=[csi_pb2.Topology(segments={"zone": "a"})]
        ),
    )
    redacted = logredact.redact(request)
    assert redacted["secrets"] == logredact.REDACTED
    assert redacted["capacity_range"] == {"required_bytes": 2**40}
    assert redacted["volume_capabilities"] == [
        {"mount": {}, "access_mode": {"mode": "SINGLE_NODE_READER_ONLY"}}
    ]
    assert redacted["parameters"] == {"image": "quay.io/example/bundle:v1"}
    assert redacted["accessibility_requirements"] == {"requisite": [{"segments": {"zone": "a"}}]}
    text = json.dumps(redacted)
    assert SECRET not in text
    assert "password" not in text and "robot" not in text


def test_redaction_of_a_message_without_secrets_set_leaves_no_mask() -> None:
    request = csi_pb2.NodeUnpublishVolumeRequest(volume_id="csi-abc", target_path="/t")
    assert logredact.redact(request) == {"volume_id": "csi-abc", "target_path": "/t"}
    assert logredact.redact(csi_pb2.DeleteVolumeRequest(volume_id="v")) == {"volume_id": "v"}


def test_redaction_renders_well_known_types_as_proto3_json() -> None:
    probe = csi_pb2.ProbeResponse(ready=wrappers_pb2.BoolValue(value=False))
    assert logredact.redact(probe) == {"ready": False}
    snapshot = csi_pb2.Snapshot(snapshot_id="s")
    snapshot.creation_time.FromSeconds(0)
    assert logredact.redact(snapshot) == {
        "snapshot_id": "s",
        "creation_time": "1970-01-01T00:00:00Z",
    }


def test_redaction_output_is_json_serialisable() -> None:
    json.dumps(logredact.redact(_publish_request()))


@pytest.mark.parametrize(
    ("message", "paths"),
    [
        (csi_pb2.NodePublishVolumeRequest, ["secrets"]),
        (csi_pb2.CreateVolumeRequest, ["secrets"]),
        (csi_pb2.NodeUnpublishVolumeRequest, []),
        (csi_pb2.ListVolumesResponse, []),
    ],
)
def test_secret_field_paths_name_what_a_log_line_hides(message: type, paths: list[str]) -> None:
    assert logredact.secret_field_paths(message.DESCRIPTOR) == paths  # type: ignore[attr-defined]
