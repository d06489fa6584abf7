"""The node plugin process over its unix socket, against the real registry.

One plugin process serves the module (a fresh one for the crash test); targets
live under its temp kubelet dir and everything mounted is unmounted at the end.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import requests

from csi import mounter
from csi.proto import csi_pb2, csi_pb2_grpc
from tests.csi_helpers import (
    PluginProcess,
    assert_read_only,
    code_of,
    dockerconfig,
    free_port,
    mount_capability,
    plugin_fixture,
    private_image,
    publish_request,
    push_image,
    simple_image,
    target,
    unpublish,
)
from tests.polling import logged
from tests.registry import RegistryServer

pytestmark = [
    pytest.mark.registry,
]


plugin = plugin_fixture("plugin")


@pytest.fixture(scope="module")
def channel(plugin: PluginProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"unix://{plugin.socket}") as ch:
        yield ch


@pytest.fixture
def node(channel: grpc.Channel) -> csi_pb2_grpc.NodeStub:
    return csi_pb2_grpc.NodeStub(channel)


# --- identity and info ----------------------------------------------------------------


def test_identity_names_the_driver_advertises_the_controller_and_is_ready(
    channel: grpc.Channel,
) -> None:
    identity = csi_pb2_grpc.IdentityStub(channel)
    info = identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest())
    assert info.name == "csi.rukpak.io" and info.vendor_version
    caps = identity.GetPluginCapabilities(csi_pb2.GetPluginCapabilitiesRequest())
    services = [c.service.type for c in caps.capabilities]
    assert services == [csi_pb2.PluginCapability.Service.CONTROLLER_SERVICE]
    assert identity.Probe(csi_pb2.ProbeRequest()).ready.value is True


def test_node_info_reports_the_node_id_and_no_volume_limit(node: csi_pb2_grpc.NodeStub) -> None:
    info = node.NodeGetInfo(csi_pb2.NodeGetInfoRequest())
    assert info.node_id == "test-node" and info.max_volumes_per_node == 0
    assert list(node.NodeGetCapabilities(csi_pb2.NodeGetCapabilitiesRequest()).capabilities) == []


def test_staging_is_not_implemented(node: csi_pb2_grpc.NodeStub) -> None:
    request = csi_pb2.NodeStageVolumeRequest(volume_id="v", staging_target_path="/x")
    assert code_of(lambda: node.NodeStageVolume(request)) == grpc.StatusCode.UNIMPLEMENTED


# --- publish / unpublish ----------------------------------------------------------------


def test_publish_mounts_the_bundle_read_only(
    plugin: PluginProcess, node: csi_pb2_grpc.NodeStub, registry: RegistryServer
) -> None:
    image = simple_image(registry.host, "node/publish", text="kind: ConfigMap")
    path = target(plugin)
    node.NodePublishVolume(publish_request(path, image.ref))
    assert (Path(path) / "manifests/cm.yaml").read_text() == "kind: ConfigMap"
    mount = mounter.find(mounter.Mounter().mounts(), Path(path))
    assert mount is not None and mount.read_only
    assert_read_only(Path(path) / "new-file")
    unpublish(node, path)
    assert not Path(path).exists()


def test_publish_twice_is_ok(
    plugin: PluginProcess, node: csi_pb2_grpc.NodeStub, registry: RegistryServer
) -> None:
    image = simple_image(registry.host, "node/twice")
    path = target(plugin)
    node.NodePublishVolume(publish_request(path, image.ref))
    node.NodePublishVolume(publish_request(path, image.ref))
    mounts = [m for m in mounter.Mounter().mounts() if m.mount_point == path]
    assert len(mounts) == 1


def test_another_image_on_a_published_target_is_already_exists(
    plugin: PluginProcess, node: csi_pb2_grpc.NodeStub, registry: RegistryServer
) -> None:
    first = simple_image(registry.host, "node/first")
    second = simple_image(registry.host, "node/second")
    path = target(plugin)
    node.NodePublishVolume(publish_request(path, first.ref))
    code = code_of(lambda: node.NodePublishVolume(publish_request(path, second.ref)))
    assert code == grpc.StatusCode.ALREADY_EXISTS


def test_unpublish_of_an_unknown_target_is_ok(
    plugin: PluginProcess, node: csi_pb2_grpc.NodeStub
) -> None:
    path = target(plugin)
    unpublish(node, path, volume_id="nope")
    unpublish(node, path, volume_id="nope")


def test_publish_outside_the_kubelet_dir_is_invalid_argument(
    node: csi_pb2_grpc.NodeStub, tmp_path: Path, registry: RegistryServer
) -> None:
    request = publish_request(str(tmp_path / "elsewhere"), f"{registry.host}/node/x:v1")
    assert code_of(lambda: node.NodePublishVolume(request)) == grpc.StatusCode.INVALID_ARGUMENT
    assert not (tmp_path / "elsewhere").exists()


def test_a_symlinked_parent_cannot_lead_outside_the_kubelet_dir(
    plugin: PluginProcess, node: csi_pb2_grpc.NodeStub, tmp_path: Path, registry: RegistryServer
) -> None:
    link = plugin.kubelet_dir / "pods" / "sneaky"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(tmp_path)
    request = publish_request(str(link / "mount"), f"{registry.host}/node/x:v1")
    assert code_of(lambda: node.NodePublishVolume(request)) == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    ("case", "change"),
    [
        ("no volume id", {"volume_id": ""}),
        ("no target path", {"target_path": ""}),
        ("no capability", {"volume_capability": None}),
        ("no image attribute", {"image": None}),
        ("bad pull policy", {"pullPolicy": "Sometimes"}),
        ("bad platform", {"platform": "linux"}),
        ("bad image reference", {"image": "UPPER/case::x"}),
        ("unknown attribute", {"imagee": "typo"}),
        ("block access", {"block": True}),
        ("multi-node writer", {"mode": "MULTI_NODE_MULTI_WRITER"}),
        ("secret without dockerconfigjson", {"secrets": {"password": "x"}}),
        ("secret that is not json", {"secrets": {".dockerconfigjson": "{not json"}}),
    ],
)
def test_bad_publish_requests_are_invalid_argument(
    plugin: PluginProcess,
    node: csi_pb2_grpc.NodeStub,
    registry: RegistryServer,
    case: str,
    change: dict[str, object],
) -> None:
    path = target(plugin)
    attrs = {k: str(v) for k, v in change.items() if k in ("pullPolicy", "platform", "imagee")}
    image = change.get("image", f"{registry.host}/node/never-pulled:v1")
    request = publish_request(
        path,
        image if image is None else str(image),
        secrets=change.get("secrets"),  # type: ignore[arg-type]
        **attrs,
    )
    if "volume_id" in change:
        request.volume_id = ""
    if "target_path" in change:
        request.target_path = ""
    if "volume_capability" in change:
        request.ClearField("volume_capability")
    if "block" in change:
        request.volume_capability.block.SetInParent()
    if "mode" in change:
        request.volume_capability.CopyFrom(mount_capability(str(change["mode"])))
    assert code_of(lambda: node.NodePublishVolume(request)) == grpc.StatusCode.INVALID_ARGUMENT
    assert not Path(path).exists()


def test_a_target_path_with_a_nul_byte_is_invalid_argument(
    plugin: PluginProcess, node: csi_pb2_grpc.NodeStub, registry: RegistryServer
) -> None:
    path = target(plugin) + "\0/evil"
    publish = publish_request(path, f"{registry.host}/node/x:v1")
    assert code_of(lambda: node.NodePublishVolume(publish)) == grpc.StatusCode.INVALID_ARGUMENT
    code = code_of(lambda: unpublish(node, path, volume_id="v"))
    assert code == grpc.StatusCode.INVALID_ARGUMENT


def test_unpublish_without_volume_id_or_target_is_invalid_argument(
    node: csi_pb2_grpc.NodeStub,
) -> None:
    for request in (
        csi_pb2.NodeUnpublishVolumeRequest(target_path="/x"),
        csi_pb2.NodeUnpublishVolumeRequest(volume_id="v"),
    ):
        code = code_of(functools.partial(node.NodeUnpublishVolume, request))
        assert code == grpc.StatusCode.INVALID_ARGUMENT


def test_an_unknown_image_is_not_found(
    plugin: PluginProcess, node: csi_pb2_grpc.NodeStub, registry: RegistryServer
) -> None:
    request = publish_request(target(plugin), f"{registry.host}/node/missing:v1")
    assert code_of(lambda: node.NodePublishVolume(request)) == grpc.StatusCode.NOT_FOUND


def test_pull_policy_never_for_an_absent_image_is_failed_precondition(
    plugin: PluginProcess, node: csi_pb2_grpc.NodeStub, registry: RegistryServer
) -> None:
    image = simple_image(registry.host, "node/never")
    request = publish_request(target(plugin), image.ref, pullPolicy="Never")
    assert code_of(lambda: node.NodePublishVolume(request)) == grpc.StatusCode.FAILED_PRECONDITION


def test_a_dead_registry_is_unavailable_and_the_message_names_the_node(
    plugin: PluginProcess, node: csi_pb2_grpc.NodeStub
) -> None:
    request = publish_request(target(plugin), f"127.0.0.1:{free_port()}/node/dead:v1")
    with pytest.raises(grpc.RpcError) as caught:
        node.NodePublishVolume(request)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE
    # another node may reach that registry: the event must say which node could not
    assert caught.value.details().endswith("(from node test-node)"), caught.value.details()


def test_credentials_from_the_secret_are_used_and_never_logged(
    plugin: PluginProcess, node: csi_pb2_grpc.NodeStub, auth_registry: RegistryServer
) -> None:
    secret, image = private_image(auth_registry, "node/private", [("f", "file", b"private")])
    path = target(plugin)
    node.NodePublishVolume(publish_request(path, image.ref, secrets=secret))
    assert (Path(path) / "f").read_text() == "private"
    log = logged(plugin.log, "method=NodePublishVolume code=OK")
    assert auth_registry.password and auth_registry.password not in log
    assert secret[".dockerconfigjson"] not in log


@pytest.mark.parametrize("secrets", ["none", "wrong password"])
def test_missing_or_wrong_credentials_are_unauthenticated_or_permission_denied(
    plugin: PluginProcess,
    node: csi_pb2_grpc.NodeStub,
    auth_registry: RegistryServer,
    secrets: str,
) -> None:
    secret = (
        dockerconfig(auth_registry.host, "rukpak", "wrong-password") if secrets != "none" else {}
    )
    request = publish_request(
        target(plugin), f"{auth_registry.host}/node/private-missing:v1", secrets=secret
    )
    line = "method=NodePublishVolume code="
    seen = plugin.log().count(line)
    code = code_of(lambda: node.NodePublishVolume(request))
    assert code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)
    log = logged(plugin.log, line, more_than=seen)
    assert "wrong-password" not in log


def test_concurrent_publishes_of_one_image_fetch_each_blob_once(
    plugin: PluginProcess, channel: grpc.Channel, registry: RegistryServer
) -> None:
    image = push_image(
        registry.host,
        "node/concurrent",
        "v1",
        [[("a", "file", os.urandom(300_000))], [("b", "file", os.urandom(300_000))]],
    )
    paths = [target(plugin) for _ in range(6)]
    failures: list[BaseException] = []

    def publish(path: str, n: int) -> None:
        try:
            stub = csi_pb2_grpc.NodeStub(channel)
            stub.NodePublishVolume(publish_request(path, image.ref, volume_id=f"vol-{n}"))
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=publish, args=(p, n)) for n, p in enumerate(paths)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    config, *layers = image.blob_digests
    for digest in layers:
        assert registry.count_requests("GET", rf"^/v2/node/concurrent/blobs/{digest}$") == 1
    # The config is shared with earlier test images, so it may already be cached.
    assert registry.count_requests("GET", rf"^/v2/node/concurrent/blobs/{config}$") <= 1
    assert all((Path(p) / "a").stat().st_size == 300_000 for p in paths)


def test_metrics_count_calls_cache_results_and_published_volumes(
    plugin: PluginProcess, node: csi_pb2_grpc.NodeStub, registry: RegistryServer
) -> None:
    image = simple_image(registry.host, "node/metrics")
    node.NodePublishVolume(publish_request(target(plugin), image.ref))
    node.NodePublishVolume(publish_request(target(plugin), image.ref, volume_id="vol-2"))
    text = requests.get(f"http://127.0.0.1:{plugin.metrics_port}/metrics", timeout=5).text
    assert 'rukpak_csi_rpc_total{code="OK",method="NodePublishVolume"}' in text
    assert 'rukpak_csi_image_cache_total{result="hit"}' in text
    published = [line for line in text.splitlines() if line.startswith("rukpak_csi_published_")]
    assert float(published[0].split()[-1]) >= 2


# --- crashes and restarts ---------------------------------------------------------------


def test_a_crash_during_a_pull_leaves_no_partial_tree_and_keeps_published_volumes(
    tmp_path: Path, registry: RegistryServer
) -> None:
    small = simple_image(registry.host, "node/crash-small", text="still here")
    many = [(f"d{i // 500}/f{i}", "file", b"x" * 200) for i in range(6000)]
    big = push_image(registry.host, "node/crash-big", "v1", [many])
    proc = PluginProcess(tmp_path).start()
    try:
        with grpc.insecure_channel(f"unix://{proc.socket}") as ch:
            stub = csi_pb2_grpc.NodeStub(ch)
            kept = target(proc)
            stub.NodePublishVolume(publish_request(kept, small.ref))
            future = stub.NodePublishVolume.future(
                publish_request(target(proc), big.ref, volume_id="vol-big")
            )
            unpacked = proc.state_dir / "images" / "unpacked"
            deadline = time.monotonic() + 30
            while not any(".tmp-" in p.name for p in unpacked.iterdir()):
                assert time.monotonic() < deadline, "the pull never started unpacking"
                assert not future.done(), "the pull finished before the crash"
                time.sleep(0.005)
            proc.kill()
        assert (Path(kept) / "manifests/cm.yaml").read_text() == "still here"
        proc.start()
        assert not any(".tmp-" in p.name for p in unpacked.iterdir())
        assert not (unpacked / big.manifest_digest.split(":")[1]).exists()
        assert list((proc.state_dir / "images/content/ingest").iterdir()) == []
        assert (Path(kept) / "manifests/cm.yaml").read_text() == "still here"
        with grpc.insecure_channel(f"unix://{proc.socket}") as ch:
            stub = csi_pb2_grpc.NodeStub(ch)
            stub.NodePublishVolume(publish_request(kept, small.ref))  # still known: OK
            again = target(proc)
            stub.NodePublishVolume(publish_request(again, big.ref, volume_id="vol-big"))
            assert (Path(again) / "d0/f0").read_bytes() == b"x" * 200
    finally:
        proc.stop()
        proc.unmount_all()


def test_republishing_after_the_holders_digest_record_was_lost_succeeds(
    tmp_path: Path, registry: RegistryServer
) -> None:
    image = simple_image(registry.host, "node/lost-record", text="kept")
    proc = PluginProcess(tmp_path).start()
    try:
        path = target(proc)
        request = publish_request(path, image.ref, volume_id="vol-lost")
        with grpc.insecure_channel(f"unix://{proc.socket}") as ch:
            csi_pb2_grpc.NodeStub(ch).NodePublishVolume(request)
        proc.stop()  # one holder file per target (rukpak.store.holders)
        [record_path] = [
            p
            for p in (proc.state_dir / "holders").glob("*.json")
            if json.loads(p.read_text())["target"] == path
        ]
        record = json.loads(record_path.read_text())
        record["digest"] = ""
        record_path.write_text(json.dumps(record))
        proc.start()
        with grpc.insecure_channel(f"unix://{proc.socket}") as ch:
            csi_pb2_grpc.NodeStub(ch).NodePublishVolume(request)  # idempotent: OK
        assert (Path(path) / "manifests/cm.yaml").read_text() == "kept"
    finally:
        proc.stop()
        proc.unmount_all()


def test_an_unreadable_state_file_is_kept_aside_and_the_plugin_starts(tmp_path: Path) -> None:
    state_path = tmp_path / "state/images/state.json"
    state_path.parent.mkdir(parents=True)
    state_path.write_text('{"holders": {"/var/lib/kubelet/pods/x": ')  # torn write
    proc = PluginProcess(tmp_path).start()
    try:
        kept = list(state_path.parent.glob("state.json.bad-*"))
        assert [p.read_text() for p in kept] == ['{"holders": {"/var/lib/kubelet/pods/x": ']
        assert "state file unreadable; kept aside" in proc.log()
    finally:
        proc.stop()


def test_the_plugin_starts_and_removes_a_leftover_staging_tree_of_any_depth(
    tmp_path: Path,
) -> None:
    leftover = tmp_path / "state/images/unpacked" / ("0" * 64 + ".tmp-dead")
    leftover.mkdir(parents=True)
    fd = os.open(leftover, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(2500):  # what a 200-byte layer with a deep pax path used to leave
        os.mkdir("a", 0o555, dir_fd=fd)
        child = os.open("a", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(fd)
    proc = PluginProcess(tmp_path).start()
    try:
        assert not leftover.exists()
    finally:
        proc.stop()


def test_sigterm_stops_the_plugin_cleanly_and_removes_its_socket(tmp_path: Path) -> None:
    proc = PluginProcess(tmp_path).start()
    assert proc.stop() == 0
    assert not proc.socket.exists()
