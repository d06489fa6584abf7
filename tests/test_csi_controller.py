"""The Controller service and kubelet registration, over the plugin's unix sockets.

CreateVolume resolves the image tag to a digest against a real registry
(``tests.registry``), so the images these tests name are pushed there first.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from csi.proto import csi_pb2, csi_pb2_grpc, pluginregistration_pb2, pluginregistration_pb2_grpc
from tests.csi_helpers import (
    PluginProcess,
    free_port,
    mount_capability,
    private_image,
    simple_image,
)
from tests.registry import RegistryServer

pytestmark = [pytest.mark.registry]

# The ``images`` fixture sets these to a pushed image (tag form) and its manifest digest;
# requests built at collection time (the invalid ones, refused before any registry
# lookup) see the placeholder.
IMAGE = "registry.example.com/bundles/demo:v1"
DIGEST = ""


@pytest.fixture(scope="module", autouse=True)
def images(registry: RegistryServer) -> None:
    global IMAGE, DIGEST
    pushed = simple_image(registry.host, "controller/demo", "v1")
    simple_image(registry.host, "controller/other", "v1", text="other")
    IMAGE, DIGEST = pushed.ref, pushed.manifest_digest


def pinned(ref: str, digest: str) -> str:
    """``host/repo:tag`` → ``host/repo@digest``, as CreateVolume names images."""
    return f"{ref.rsplit(':', 1)[0]}@{digest}"


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


def test_create_volume_pins_the_image_tag_to_its_digest_in_the_volume_context(
    controller: csi_pb2_grpc.ControllerStub,
) -> None:
    request = create("pvc-1", pullPolicy="Always")
    request.parameters["csi.storage.k8s.io/pvc/name"] = "claim"
    vol = controller.CreateVolume(request).volume
    assert vol.volume_id.startswith("bundle-")
    assert vol.capacity_bytes == 0  # nothing requested, nothing reported
    assert dict(vol.volume_context) == {"image": pinned(IMAGE, DIGEST), "pullPolicy": "Always"}


def test_a_retried_create_keeps_the_first_digest_after_the_tag_moved(
    controller: csi_pb2_grpc.ControllerStub, registry: RegistryServer
) -> None:
    first = simple_image(registry.host, "controller/moving", "v1", text="first")
    before = controller.CreateVolume(create("pvc-moving", image=first.ref)).volume
    second = simple_image(registry.host, "controller/moving", "v1", text="second")
    assert second.manifest_digest != first.manifest_digest
    again = controller.CreateVolume(create("pvc-moving", image=first.ref)).volume
    assert again.volume_id == before.volume_id
    assert again.volume_context["image"] == pinned(first.ref, first.manifest_digest)
    # a new volume from the same class now gets the new content
    fresh = controller.CreateVolume(create("pvc-moving-2", image=first.ref)).volume
    assert fresh.volume_context["image"] == pinned(first.ref, second.manifest_digest)


def test_an_image_named_by_digest_is_passed_on_without_asking_the_registry(
    controller: csi_pb2_grpc.ControllerStub,
) -> None:
    # a registry that does not exist: a digest reference needs none
    ref = f"127.0.0.1:{free_port()}/gone/bundle@{DIGEST}"
    vol = controller.CreateVolume(create("pvc-by-digest", image=ref)).volume
    assert vol.volume_context["image"] == ref


@pytest.mark.parametrize(
    ("image", "code", "words"),
    [
        ("missing-tag", grpc.StatusCode.NOT_FOUND, "names a pushed tag"),
        ("dead-registry", grpc.StatusCode.UNAVAILABLE, "to a digest"),
    ],
)
def test_an_image_that_cannot_be_resolved_fails_naming_it(
    controller: csi_pb2_grpc.ControllerStub,
    registry: RegistryServer,
    image: str,
    code: grpc.StatusCode,
    words: str,
) -> None:
    ref = {
        "missing-tag": f"{registry.host}/controller/demo:no-such-tag",
        "dead-registry": f"127.0.0.1:{free_port()}/controller/demo:v1",
    }[image]
    with pytest.raises(grpc.RpcError) as info:
        controller.CreateVolume(create(f"pvc-unresolved-{image}", image=ref))
    assert info.value.code() == code
    assert ref in (info.value.details() or "") and words in (info.value.details() or "")


def test_a_private_image_is_resolved_with_the_secrets_of_the_request(
    plugin: PluginProcess, controller: csi_pb2_grpc.ControllerStub, auth_registry: RegistryServer
) -> None:
    secret, image = private_image(auth_registry, "controller/private", [("f", "file", b"x")])
    anonymous = create("pvc-private-anon", image=image.ref)
    with pytest.raises(grpc.RpcError) as info:
        controller.CreateVolume(anonymous)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "provisioner-secret-name" in (info.value.details() or "")

    request = create("pvc-private", image=image.ref)
    request.secrets.update(secret)
    vol = controller.CreateVolume(request).volume
    assert vol.volume_context["image"] == pinned(image.ref, image.manifest_digest)
    assert auth_registry.password and auth_registry.password not in plugin.log()


def test_creating_the_same_volume_twice_returns_the_same_id(
    controller: csi_pb2_grpc.ControllerStub,
) -> None:
    first = controller.CreateVolume(create("pvc-twice", mode="SINGLE_NODE_WRITER"))
    second = controller.CreateVolume(create("pvc-twice", mode="SINGLE_NODE_WRITER"))
    assert first.volume.volume_id == second.volume.volume_id


@pytest.mark.parametrize(
    "other",
    [
        {"image": "other"},  # replaced by the pushed controller/other image
        {"pullPolicy": "Never"},
        {"required": 1 << 30},
    ],
)
def test_same_name_with_other_parameters_or_capacity_is_already_exists(
    controller: csi_pb2_grpc.ControllerStub, other: dict[str, object]
) -> None:
    name = f"pvc-conflict-{sorted(other)[0]}"
    controller.CreateVolume(create(name))
    if other.get("image") == "other":
        other = {"image": IMAGE.replace("controller/demo", "controller/other")}
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
