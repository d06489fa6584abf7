"""The Controller service and kubelet registration, over the plugin's unix sockets."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from csi.proto import csi_pb2, csi_pb2_grpc, pluginregistration_pb2, pluginregistration_pb2_grpc
from tests.csi_helpers import PluginProcess, mount_capability

IMAGE = "registry.example.com/bundles/demo:v1"


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PluginProcess]:
    workdir = tmp_path_factory.mktemp("controller")
    proc = PluginProcess(
        workdir,
        extra_args=(
            "--registration-dir", str(workdir / "registry"),
            "--kubelet-registration-path", "/var/lib/kubelet/plugins/csi.rukpak.io/csi.sock",
        ),
    ).start()  # fmt: skip
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def controller(plugin: PluginProcess) -> Iterator[csi_pb2_grpc.ControllerStub]:
    with grpc.insecure_channel(f"unix://{plugin.socket}") as ch:
        yield csi_pb2_grpc.ControllerStub(ch)


def create(
    name: str,
    *,
    mode: str = "MULTI_NODE_READER_ONLY",
    required: int = 0,
    **parameters: str,
) -> csi_pb2.CreateVolumeRequest:
    parameters.setdefault("image", IMAGE)
    return csi_pb2.CreateVolumeRequest(
        name=name,
        volume_capabilities=[mount_capability(mode)],
        capacity_range=csi_pb2.CapacityRange(required_bytes=required),
        parameters=parameters,
    )


def code_of(call: object) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()  # type: ignore[operator]
    return info.value.code()  # type: ignore[no-any-return]


def test_create_volume_copies_the_source_into_the_volume_context(
    controller: csi_pb2_grpc.ControllerStub,
) -> None:
    request = create("pvc-1", pullPolicy="Always")
    request.parameters["csi.storage.k8s.io/pvc/name"] = "claim"
    vol = controller.CreateVolume(request).volume
    assert vol.volume_id.startswith("bundle-")
    assert vol.capacity_bytes == 0  # nothing requested, nothing reported
    assert dict(vol.volume_context) == {"image": IMAGE, "pullPolicy": "Always"}


def test_creating_the_same_volume_twice_returns_the_same_id(
    controller: csi_pb2_grpc.ControllerStub,
) -> None:
    first = controller.CreateVolume(create("pvc-twice", mode="SINGLE_NODE_WRITER"))
    second = controller.CreateVolume(create("pvc-twice", mode="SINGLE_NODE_WRITER"))
    assert first.volume.volume_id == second.volume.volume_id


@pytest.mark.parametrize(
    "other",
    [
        {"image": "registry.example.com/bundles/other:v1"},
        {"pullPolicy": "Never"},
        {"required": 1 << 30},
    ],
)
def test_same_name_with_other_parameters_or_capacity_is_already_exists(
    controller: csi_pb2_grpc.ControllerStub, other: dict[str, object]
) -> None:
    name = f"pvc-conflict-{sorted(other)[0]}"
    controller.CreateVolume(create(name))
    request = create(name, **other)  # type: ignore[arg-type]
    assert code_of(lambda: controller.CreateVolume(request)) == grpc.StatusCode.ALREADY_EXISTS


@pytest.mark.parametrize(
    "request_",
    [
        csi_pb2.CreateVolumeRequest(volume_capabilities=[mount_capability()]),
        csi_pb2.CreateVolumeRequest(name="no-caps", parameters={"image": IMAGE}),
        create("no-image", image=""),
        create("bad-image", image="Not A Reference"),
        create("bad-policy", pullPolicy="Often"),
        create("multi-writer", mode="MULTI_NODE_MULTI_WRITER"),
        create("typo", imag="x"),
    ],
    ids=["no name", "no capabilities", "no image", "bad image", "bad policy", "rwx", "typo"],
)
def test_bad_create_requests_are_invalid_argument(
    controller: csi_pb2_grpc.ControllerStub, request_: csi_pb2.CreateVolumeRequest
) -> None:
    assert code_of(lambda: controller.CreateVolume(request_)) == grpc.StatusCode.INVALID_ARGUMENT


def test_delete_is_idempotent_and_validate_then_reports_not_found(
    controller: csi_pb2_grpc.ControllerStub,
) -> None:
    vol = controller.CreateVolume(create("pvc-delete")).volume
    validate = csi_pb2.ValidateVolumeCapabilitiesRequest(
        volume_id=vol.volume_id, volume_capabilities=[mount_capability()]
    )
    assert controller.ValidateVolumeCapabilities(validate).HasField("confirmed")
    controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=vol.volume_id))
    controller.DeleteVolume(csi_pb2.DeleteVolumeRequest(volume_id=vol.volume_id))
    code = code_of(lambda: controller.ValidateVolumeCapabilities(validate))
    assert code == grpc.StatusCode.NOT_FOUND


def test_validate_does_not_confirm_block_or_multi_writer_access(
    controller: csi_pb2_grpc.ControllerStub,
) -> None:
    vol = controller.CreateVolume(create("pvc-validate")).volume
    block = csi_pb2.VolumeCapability(
        block=csi_pb2.VolumeCapability.BlockVolume(),
        access_mode=mount_capability().access_mode,
    )
    for capability in (block, mount_capability("MULTI_NODE_MULTI_WRITER")):
        response = controller.ValidateVolumeCapabilities(
            csi_pb2.ValidateVolumeCapabilitiesRequest(
                volume_id=vol.volume_id, volume_capabilities=[capability]
            )
        )
        assert not response.HasField("confirmed") and response.message


def test_controller_advertises_create_delete_only(controller: csi_pb2_grpc.ControllerStub) -> None:
    caps = controller.ControllerGetCapabilities(csi_pb2.ControllerGetCapabilitiesRequest())
    assert [c.rpc.type for c in caps.capabilities] == [
        csi_pb2.ControllerServiceCapability.RPC.CREATE_DELETE_VOLUME
    ]


def test_volumes_survive_a_restart(plugin: PluginProcess) -> None:
    with grpc.insecure_channel(f"unix://{plugin.socket}") as ch:
        before = csi_pb2_grpc.ControllerStub(ch).CreateVolume(create("pvc-restart")).volume
    plugin.stop()
    plugin.start()
    with grpc.insecure_channel(f"unix://{plugin.socket}") as ch:
        stub = csi_pb2_grpc.ControllerStub(ch)
        conflict = create("pvc-restart", pullPolicy="Never")
        assert code_of(lambda: stub.CreateVolume(conflict)) == grpc.StatusCode.ALREADY_EXISTS
        assert stub.CreateVolume(create("pvc-restart")).volume.volume_id == before.volume_id


def test_kubelet_registration_reports_the_driver_and_its_kubelet_path(
    plugin: PluginProcess,
) -> None:
    reg_socket = plugin.workdir / "registry" / "csi.rukpak.io-reg.sock"
    with grpc.insecure_channel(f"unix://{reg_socket}") as ch:
        stub = pluginregistration_pb2_grpc.RegistrationStub(ch)
        info = stub.GetInfo(pluginregistration_pb2.InfoRequest(), timeout=5)
        assert info.type == "CSIPlugin"
        assert info.name == "csi.rukpak.io"
        assert info.endpoint == "/var/lib/kubelet/plugins/csi.rukpak.io/csi.sock"
        assert list(info.supported_versions) == ["1.0.0"]
        stub.NotifyRegistrationStatus(
            pluginregistration_pb2.RegistrationStatus(plugin_registered=True), timeout=5
        )


def test_create_volume_reports_the_requested_capacity(
    controller: csi_pb2_grpc.ControllerStub,
) -> None:
    vol = controller.CreateVolume(create("pvc-sized", required=1 << 20)).volume
    assert vol.capacity_bytes == 1 << 20
