"""Live content refresh (volume attribute ``refresh``, ``csi.node.refresh``) through the
real node plugin and a real registry: a volume follows its tag while mounted, switching
atomically (a reader that resolves ``..data`` once sees one digest's files only), tells
the digest in use in ``..digest``, keeps the previous version, survives a plugin restart,
and leaves nothing behind when unpublished; bad attributes are refused by name.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from csi import mounter
from csi.node import refresh
from csi.proto import csi_pb2, csi_pb2_grpc
from tests.csi_helpers import (
    Entry,
    PluginProcess,
    PushedImage,
    assert_read_only,
    node_fixture,
    publish_request,
    push_image,
    running_plugin,
    target,
)
from tests.polling import eventually
from tests.registry import RegistryServer

pytestmark = [pytest.mark.registry]
FILES = 20


def version(registry: RegistryServer, repo: str, text: str) -> PushedImage:
    """Push ``repo:live`` holding FILES manifests, each saying ``text``."""
    entries: list[Entry] = [("manifests/", "dir")]
    entries += [(f"manifests/f{i:02}.yaml", "file", text.encode()) for i in range(FILES)]
    if text.endswith("2"):
        entries.append(("added-in-two.txt", "file", b"new top-level entry"))
    return push_image(registry.host, repo, "live", [entries])


@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[PluginProcess]:
    with running_plugin(tmp_path / "plugin") as proc:
        yield proc


node = node_fixture(scope="function")


def publish(node: csi_pb2_grpc.NodeStub, plugin: PluginProcess, ref: str, every: str) -> Path:
    path = target(plugin)
    node.NodePublishVolume(publish_request(path, ref, volume_id="live-1", refresh=every))
    return Path(path)


def digest_in(view: Path) -> str:
    return (view / refresh.DIGEST_FILE).read_text().split()[0]


def test_a_volume_follows_its_tag_atomically_and_keeps_the_previous_version(
    node: csi_pb2_grpc.NodeStub, plugin: PluginProcess, registry: RegistryServer
) -> None:
    one = version(registry, "refresh/app", "version 1")
    ref = f"{registry.host}/refresh/app:live"
    view = publish(node, plugin, ref, "1s")
    assert (view / "manifests" / "f00.yaml").read_text() == "version 1"
    assert digest_in(view) == one.manifest_digest
    assert not (view / "added-in-two.txt").exists()
    assert_read_only(view / "manifests" / "new.yaml")

    mixed: list[set[str]] = []
    stop = threading.Event()

    def reader() -> None:  # resolves ..data once per pass, as a consistent reader does
        while not stop.is_set():
            try:
                data = Path(os.path.realpath(view / refresh.DATA))
                seen = {(data / "manifests" / f"f{i:02}.yaml").read_text() for i in range(FILES)}
            except FileNotFoundError:
                continue  # the version it resolved to went (two updates later): read again
            if len(seen) != 1:
                mixed.append(seen)

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        two = version(registry, "refresh/app", "version 2")
        eventually(lambda: digest_in(view) == two.manifest_digest, timeout=30, what="version 2")
        assert (view / "manifests" / "f07.yaml").read_text() == "version 2"
        assert (view / "added-in-two.txt").read_text() == "new top-level entry"
        three = version(registry, "refresh/app", "version 3")
        eventually(lambda: digest_in(view) == three.manifest_digest, timeout=30, what="3")
    finally:
        stop.set()
        thread.join(timeout=10)
    assert mixed == [], "a reader saw files of two versions"
    assert not (view / "added-in-two.txt").exists(), "a name gone from the tag is gone"
    kept = sorted(refresh.version_name(d) for d in (two.manifest_digest, three.manifest_digest))

    def versions() -> list[str]:
        return sorted(p.name for p in view.iterdir() if p.name.startswith(refresh.VERSION_PREFIX))

    # the oldest version goes a moment after the swap (the swap is what digest_in saw)
    eventually(
        lambda: versions() == kept, timeout=30, what="the version in use and the one before kept"
    )
    # the plugin logs a refresh after it swapped the view: wait for the line, not the swap
    eventually(
        lambda: all(f"to={d.manifest_digest}" in plugin.log() for d in (two, three)),
        timeout=30,
        what="both refreshes logged",
    )


def test_unpublish_leaves_no_view_mount_or_hold(
    node: csi_pb2_grpc.NodeStub, plugin: PluginProcess, registry: RegistryServer
) -> None:
    version(registry, "refresh/gone", "only")
    view = publish(node, plugin, f"{registry.host}/refresh/gone:live", "30s")
    assert (view / "manifests" / "f00.yaml").read_text() == "only"
    node.NodeUnpublishVolume(
        csi_pb2.NodeUnpublishVolumeRequest(volume_id="live-1", target_path=str(view))
    )
    assert not view.exists()
    views = plugin.state_dir / "views"
    assert not views.exists() or os.listdir(views) == []
    assert not [m for m in mounter.Mounter().mounts() if m.mount_point == str(view)]


def test_a_restarted_plugin_goes_on_refreshing(tmp_path: Path, registry: RegistryServer) -> None:
    version(registry, "refresh/restart", "before")
    ref = f"{registry.host}/refresh/restart:live"
    with running_plugin(tmp_path / "restart") as proc:
        with grpc.insecure_channel(f"unix://{proc.socket}") as channel:
            view = publish(csi_pb2_grpc.NodeStub(channel), proc, ref, "1s")
        proc.stop()
        after = version(registry, "refresh/restart", "after")
        proc.start()
        eventually(lambda: digest_in(view) == after.manifest_digest, timeout=30, what="after")
        assert (view / "manifests" / "f03.yaml").read_text() == "after"
        with grpc.insecure_channel(f"unix://{proc.socket}") as channel:
            csi_pb2_grpc.NodeStub(channel).NodeUnpublishVolume(
                csi_pb2.NodeUnpublishVolumeRequest(volume_id="live-1", target_path=str(view))
            )
        assert not view.exists()


@pytest.mark.parametrize(
    ("extra", "pinned", "words"),
    [
        ({"refresh": "0s"}, False, "a duration from 1s"),
        ({"refresh": "soon"}, False, "a duration from 1s"),
        ({"refresh": "25h"}, False, "a duration from 1s"),
        ({"refresh": "30s"}, True, "name the image by tag"),
        ({"refresh": "30s", "publishMode": "fuse"}, False, "served in bind mode"),
    ],
    ids=["zero", "words", "too-long", "pinned", "fuse"],
)
def test_bad_refresh_attributes_are_refused_by_name(
    node: csi_pb2_grpc.NodeStub,
    plugin: PluginProcess,
    registry: RegistryServer,
    extra: dict[str, str],
    pinned: bool,
    words: str,
) -> None:
    image = version(registry, "refresh/bad", "x")
    ref = f"{registry.host}/refresh/bad@{image.manifest_digest}" if pinned else image.ref
    request = publish_request(target(plugin), ref)
    request.volume_context.update(extra)
    with pytest.raises(grpc.RpcError) as info:
        node.NodePublishVolume(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert words in str(info.value.details())
