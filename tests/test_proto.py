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

from csi.proto import csi_pb2, csi_pb2_grpc, pluginregistration_pb2
from csi.rpc import redact

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


def spec_table(text: str, start: int) -> list[tuple[str, dict[str, int]]]:
    """``Message: name name ...`` lines (``#`` comments, indented lines continue the one
    before) as ``(message, {name: number})``: the spec numbers each message's fields from 1
    and each enum's values from 0, in order and without gaps."""
    rows: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        if line.startswith("        "):
            rows[-1][1].extend(line.split())
            continue
        message, _, names = line.partition(":")
        rows.append((message.strip(), names.split()))
    return [(m, {n: i for i, n in enumerate(names, start)}) for m, names in rows]


# Each message's fields, in field-number order.
FIELD_NUMBERS = spec_table(
    """
    # Identity
    GetPluginInfoResponse: name vendor_version manifest
    GetPluginCapabilitiesResponse: capabilities
    PluginCapability: service volume_expansion
    PluginCapability.Service: type
    ProbeResponse: ready
    # Controller
    CreateVolumeRequest: name capacity_range volume_capabilities parameters secrets
        volume_content_source accessibility_requirements mutable_parameters
    CreateVolumeResponse: volume
    Volume: capacity_bytes volume_id volume_context content_source accessible_topology
    VolumeCapability: block mount access_mode
    VolumeCapability.MountVolume: fs_type mount_flags volume_mount_group
    VolumeCapability.AccessMode: mode
    VolumeContentSource: snapshot volume
    CapacityRange: required_bytes limit_bytes
    TopologyRequirement: requisite preferred
    Topology: segments
    DeleteVolumeRequest: volume_id secrets
    ValidateVolumeCapabilitiesRequest: volume_id volume_context volume_capabilities parameters
        secrets mutable_parameters
    ValidateVolumeCapabilitiesResponse: confirmed message
    ValidateVolumeCapabilitiesResponse.Confirmed: volume_context volume_capabilities parameters
        mutable_parameters
    ControllerModifyVolumeRequest: volume_id secrets mutable_parameters
    GetCapacityResponse: available_capacity maximum_volume_size minimum_volume_size
    Snapshot: size_bytes snapshot_id source_volume_id creation_time ready_to_use group_snapshot_id
    # Node
    NodePublishVolumeRequest: volume_id publish_context staging_target_path target_path
        volume_capability readonly secrets volume_context
    NodeUnpublishVolumeRequest: volume_id target_path
    NodeStageVolumeRequest: volume_id publish_context staging_target_path volume_capability secrets
        volume_context
    NodeGetVolumeStatsRequest: volume_id volume_path staging_target_path
    NodeGetVolumeStatsResponse: usage volume_condition
    VolumeUsage: available total used unit
    VolumeCondition: abnormal message
    NodeGetInfoResponse: node_id max_volumes_per_node accessible_topology
    NodeServiceCapability: rpc
    NodeExpandVolumeRequest: volume_id volume_path capacity_range staging_target_path
        volume_capability secrets
    # SnapshotMetadata
    GetMetadataDeltaRequest: base_snapshot_id target_snapshot_id starting_offset max_results secrets
""",
    start=1,
)


@pytest.mark.parametrize(("message", "numbers"), FIELD_NUMBERS, ids=[m for m, _ in FIELD_NUMBERS])
def test_csi_field_numbers_match_the_spec(message: str, numbers: dict[str, int]) -> None:
    desc = _message(csi_pb2, message)
    assert {f.name: f.number for f in desc.fields} == numbers


# Each enum's values, in value order.
ENUM_VALUES = spec_table(
    """
    VolumeCapability.AccessMode.Mode: UNKNOWN SINGLE_NODE_WRITER SINGLE_NODE_READER_ONLY
        MULTI_NODE_READER_ONLY MULTI_NODE_SINGLE_WRITER MULTI_NODE_MULTI_WRITER
        SINGLE_NODE_SINGLE_WRITER SINGLE_NODE_MULTI_WRITER
    NodeServiceCapability.RPC.Type: UNKNOWN STAGE_UNSTAGE_VOLUME GET_VOLUME_STATS EXPAND_VOLUME
        VOLUME_CONDITION SINGLE_NODE_MULTI_WRITER VOLUME_MOUNT_GROUP
    ControllerServiceCapability.RPC.Type: UNKNOWN CREATE_DELETE_VOLUME PUBLISH_UNPUBLISH_VOLUME
        LIST_VOLUMES GET_CAPACITY CREATE_DELETE_SNAPSHOT LIST_SNAPSHOTS CLONE_VOLUME
        PUBLISH_READONLY EXPAND_VOLUME LIST_VOLUMES_PUBLISHED_NODES VOLUME_CONDITION GET_VOLUME
        SINGLE_NODE_MULTI_WRITER MODIFY_VOLUME GET_SNAPSHOT
    PluginCapability.Service.Type: UNKNOWN CONTROLLER_SERVICE VOLUME_ACCESSIBILITY_CONSTRAINTS
        GROUP_CONTROLLER_SERVICE SNAPSHOT_METADATA_SERVICE
    PluginCapability.VolumeExpansion.Type: UNKNOWN ONLINE OFFLINE
    VolumeUsage.Unit: UNKNOWN BYTES INODES
    GroupControllerServiceCapability.RPC.Type: UNKNOWN CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT
""",
    start=0,
)


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
    secret = {f.full_name for f in _every_csi_field() if redact.is_secret(f)}
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
    assert redact.redact(_publish_request()) == {
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
    redacted = redact.redact(request)
    assert redacted["secrets"] == redact.REDACTED
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
    assert redact.redact(request) == {"volume_id": "csi-abc", "target_path": "/t"}
    assert redact.redact(csi_pb2.DeleteVolumeRequest(volume_id="v")) == {"volume_id": "v"}


def test_redaction_renders_well_known_types_as_proto3_json() -> None:
    probe = csi_pb2.ProbeResponse(ready=wrappers_pb2.BoolValue(value=False))
    assert redact.redact(probe) == {"ready": False}
    snapshot = csi_pb2.Snapshot(snapshot_id="s")
    snapshot.creation_time.FromSeconds(0)
    assert redact.redact(snapshot) == {
        "snapshot_id": "s",
        "creation_time": "1970-01-01T00:00:00Z",
    }


def test_redaction_output_is_json_serialisable() -> None:
    json.dumps(redact.redact(_publish_request()))


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
    assert redact.secret_field_paths(message.DESCRIPTOR) == paths  # type: ignore[attr-defined]
