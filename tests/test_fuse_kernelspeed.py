"""FUSE mode's overlay presentation: fully fetched trees as overlays over the file store.

Through the real plugin process, a real registry and real mounts (overlayfs, tmpfs,
the FUSE mount of a holder the test starts and stops by pid). What is checked: a
fully fetched tree is an overlay whose files, modes, links and times are bind mode's;
nothing in it is writable; unpublish leaves no mount and no metadata; a tree whose
stored file is missing or damaged fails the publish with DATA_LOSS naming the file;
a lazy tree stays on the FUSE view until fetched; overlays outlive a ``kill -9`` of
the plugin and a restarted plugin unpublishes them. The metadata builder's refusal of
names an index should never hold is checked without mounts.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from csi import mounter
from csi.fuse import index, overlay
from csi.fuse.filestore import FileStore
from csi.proto import csi_pb2_grpc
from provisioner.cli import main as cli
from rukpak.common import errors
from rukpak.store import holders
from tests import csi_helpers
from tests.fuse_helpers import fuse_plugin, publish_bind_and_fuse, publish_fuse
from tests.polling import logged
from tests.registry import RegistryServer

pytestmark = [pytest.mark.registry]


node = csi_helpers.node_fixture(scope="function")


@pytest.fixture(name="plugin")
def _overlay_plugin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[csi_helpers.PluginProcess]:
    """A FUSE plugin presenting fetched trees as overlays (``FUSE_LINKED=false``: the
    fallback where hard links into the store are impossible; linked trees are
    ``test_fuse_linked``'s), for the whole test, restarts included."""
    monkeypatch.setenv("FUSE_LINKED", "false")
    with fuse_plugin(tmp_path) as proc:
        yield proc


def _bundle(registry: RegistryServer, repo: str) -> str:
    entries: list[csi_helpers.Entry] = [("manifests/", "dir")]
    for i in range(20):
        entries.append((f"manifests/{i:02}.yaml", "file", f"kind: ConfigMap # {i}\n".encode() * i))
    entries += [("manifests/link.yaml", "symlink", "01.yaml"), ("bin/run", "file", b"#!/bin/sh\n")]
    return csi_helpers.push_image(registry.host, repo, "v1", [entries]).ref


def _configmap(n: int) -> str:
    return f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c{n}\n"


def _mount_on(path: str) -> mounter.MountInfo | None:
    return mounter.find(mounter.Mounter().mounts(), Path(path))


def _meta(plugin: csi_helpers.PluginProcess) -> Path:
    return plugin.state_dir / "fuse" / "meta"


def _stored(plugin: csi_helpers.PluginProcess, content: bytes) -> Path:
    files = plugin.state_dir / "fuse" / "store" / "files" / "sha256"
    (found,) = [p for p in files.iterdir() if p.read_bytes() == content]
    return found


def _stored_once(
    plugin: csi_helpers.PluginProcess,
    node: csi_pb2_grpc.NodeStub,
    registry: RegistryServer,
    repo: str,
    content: bytes,
) -> tuple[str, Path]:
    """An image of one file holding ``content``, published in FUSE mode and unpublished:
    the image and the stored file that the next publish presents."""
    image = csi_helpers.push_image(registry.host, repo, "v1", [[("cm.yaml", "file", content)]]).ref
    first = publish_fuse(plugin, node, image)
    csi_helpers.unpublish(node, first)
    return image, _stored(plugin, content)


def _published_then_killed(
    plugin: csi_helpers.PluginProcess,
    node: csi_pb2_grpc.NodeStub,
    registry: RegistryServer,
    repo: str,
) -> tuple[str, str, dict[str, str]]:
    """A bundle published in FUSE mode (an overlay), then the plugin killed with SIGKILL:
    the image, the volume and the volume's tree before the kill."""
    image = _bundle(registry, repo)
    volume = publish_fuse(plugin, node, image)
    expected = csi_helpers.tree(Path(volume))
    plugin.kill()
    return image, volume, expected


def _republished_and_unpublished(
    plugin: csi_helpers.PluginProcess, image: str, volume: str
) -> None:
    """On the restarted plugin: publishing ``volume`` again is OK (twice is), and
    unpublishing it leaves no mount and no metadata."""
    with grpc.insecure_channel(f"unix://{plugin.socket}") as channel:
        again = csi_pb2_grpc.NodeStub(channel)
        again.NodePublishVolume(csi_helpers.publish_request(volume, image, publishMode="fuse"))
        csi_helpers.unpublish(again, volume)
    assert _mount_on(volume) is None
    assert list(_meta(plugin).iterdir()) == []


def test_a_fetched_tree_is_an_overlay_with_bind_modes_content_and_metadata(
    plugin: csi_helpers.PluginProcess, node: csi_pb2_grpc.NodeStub, registry: RegistryServer
) -> None:
    image = _bundle(registry, "kernelspeed/same")
    bind_target, fuse_target = publish_bind_and_fuse(plugin, node, image)
    mount = _mount_on(fuse_target)
    assert mount is not None and mount.fstype == "overlay"
    assert {"ro", "nosuid", "nodev"} <= set(mount.options)
    assert csi_helpers.tree(Path(fuse_target)) == csi_helpers.tree(Path(bind_target))
    assert os.stat(fuse_target).st_mode == os.stat(Path(bind_target)).st_mode
    for rel in ("manifests/05.yaml", "bin/run"):  # bind mode keeps no symlink times
        ours, theirs = os.lstat(Path(fuse_target, rel)), os.lstat(Path(bind_target, rel))
        assert (ours.st_mode, ours.st_size, ours.st_mtime) == (
            theirs.st_mode,
            theirs.st_size,
            theirs.st_mtime,
        ), rel
    csi_helpers.assert_read_only(Path(fuse_target, "manifests/new.yaml"))
    with pytest.raises(OSError) as raised:
        os.open(Path(fuse_target, "manifests/00.yaml"), os.O_WRONLY)
    assert raised.value.errno == errno.EROFS
    # Reads come from the stored file itself: the same inode's page cache for every tree.
    assert "presentation=overlay" in plugin.log()
    # Publishing twice is OK; unpublishing removes the mount, the target and the metadata.
    node.NodePublishVolume(csi_helpers.publish_request(fuse_target, image, publishMode="fuse"))
    (meta,) = [p for p in _meta(plugin).iterdir()]
    csi_helpers.unpublish(node, fuse_target)
    assert _mount_on(fuse_target) is None
    assert not Path(fuse_target).exists()
    assert not meta.exists()
    assert not any(m.fstype == "overlay" and str(meta) in ",".join(m.super_options)
                   for m in mounter.Mounter().mounts())  # fmt: skip


def test_a_tree_whose_stored_file_is_missing_fails_clearly_and_mounts_nothing(
    plugin: csi_helpers.PluginProcess, node: csi_pb2_grpc.NodeStub, registry: RegistryServer
) -> None:
    image, stored = _stored_once(plugin, node, registry, "kernelspeed/missing", b"gone soon")
    stored.unlink()
    again = csi_helpers.target(plugin)
    with pytest.raises(grpc.RpcError) as raised:
        node.NodePublishVolume(csi_helpers.publish_request(again, image, publishMode="fuse"))
    assert raised.value.code() == grpc.StatusCode.DATA_LOSS
    assert "cm.yaml" in str(raised.value.details())
    assert _mount_on(again) is None


def test_a_damaged_stored_file_fails_the_first_publish_of_a_new_plugin(
    plugin: csi_helpers.PluginProcess, node: csi_pb2_grpc.NodeStub, registry: RegistryServer
) -> None:
    image, stored = _stored_once(plugin, node, registry, "kernelspeed/damaged", b"the real content")
    stored.chmod(0o644)
    stored.write_bytes(b"the evil content")
    plugin.stop()
    plugin.start()  # a new process checks every stored file before it presents a tree
    with grpc.insecure_channel(f"unix://{plugin.socket}") as channel:
        again = csi_helpers.target(plugin)
        with pytest.raises(grpc.RpcError) as raised:
            csi_pb2_grpc.NodeStub(channel).NodePublishVolume(
                csi_helpers.publish_request(again, image, publishMode="fuse")
            )
    assert raised.value.code() == grpc.StatusCode.DATA_LOSS
    assert "does not match its digest" in str(raised.value.details())
    assert _mount_on(again) is None


def test_a_lazy_tree_stays_on_fuse_until_fetched_then_publishes_as_an_overlay(
    tmp_path: Path,
    plugin: csi_helpers.PluginProcess,
    node: csi_pb2_grpc.NodeStub,
    registry: RegistryServer,
) -> None:
    bundle = tmp_path / "bundle"
    (bundle / "manifests").mkdir(parents=True)
    for n in range(10):
        (bundle / f"manifests/{n}.yaml").write_text(_configmap(n))
    ref = f"{registry.host}/kernelspeed/lazy:v1"
    assert cli.main(["bundle", "build", str(bundle), "--tag", ref, "--estargz", "--push"]) == 0
    lazy = publish_fuse(plugin, node, ref)
    mount = _mount_on(lazy)
    assert mount is not None and mount.fstype.startswith("fuse")
    logged(plugin.log, "lazy tree complete, layers verified", timeout=60)
    fetched = publish_fuse(plugin, node, ref)
    mount = _mount_on(fetched)
    assert mount is not None and mount.fstype == "overlay"
    assert csi_helpers.tree(Path(fetched)) == csi_helpers.tree(Path(lazy))
    assert Path(fetched, "manifests/7.yaml").read_text() == _configmap(7)


def test_overlays_outlive_a_kill_9_and_the_restarted_plugin_unpublishes_them(
    plugin: csi_helpers.PluginProcess, node: csi_pb2_grpc.NodeStub, registry: RegistryServer
) -> None:
    image, volume, expected = _published_then_killed(plugin, node, registry, "kernelspeed/restart")
    assert csi_helpers.tree(Path(volume)) == expected  # no daemon serves it: the kernel does
    plugin.start()
    _republished_and_unpublished(plugin, image, volume)


def test_mountinfo_gives_the_filesystem_type_and_its_options() -> None:
    line = (
        r"251 27 0:128 / /k/pods/a\040b ro,nosuid,relatime shared:5 - overlay rukpak "
        "ro,lowerdir=/s/meta/ab::/s/files/sha256,redirect_dir=on,metacopy=on"
    )
    (info,) = mounter.parse_mountinfo(line)
    assert (info.mount_point, info.fstype) == ("/k/pods/a b", "overlay")
    assert "lowerdir=/s/meta/ab::/s/files/sha256" in info.super_options
    assert info.read_only


@pytest.mark.parametrize("name", ["a/b", "..", ".", ""])
def test_the_metadata_builder_refuses_names_that_are_not_plain(tmp_path: Path, name: str) -> None:
    digest = "sha256:" + "a" * 64
    rows = [
        index.Row(-1, "", index.DIR, 0o555, 0, "", "", 0),
        index.Row(0, name, index.FILE, 0o444, 3, digest, "", 0),
    ]
    meta = overlay.MetaTrees(tmp_path / "meta", FileStore(tmp_path / "store"))
    (tmp_path / "meta").mkdir()
    with pytest.raises(errors.InvalidArgument, match="not a plain name"):
        overlay._write(index.Index(digest, rows, {0: {name: 1}}), meta.root / "t")
    assert not (tmp_path / "escaped").exists()


def test_the_metadata_builder_refuses_a_redirect_that_is_not_a_digest(tmp_path: Path) -> None:
    rows = [
        index.Row(-1, "", index.DIR, 0o555, 0, "", "", 0),
        index.Row(0, "f", index.FILE, 0o444, 3, "sha256:../../etc/passwd", "", 0),
    ]
    with pytest.raises(errors.InvalidArgument, match="bad digest"):
        overlay._write(index.Index("sha256:" + "b" * 64, rows, {0: {"f": 1}}), tmp_path / "t")


def test_the_metadata_builder_never_creates_below_a_symlink(tmp_path: Path) -> None:
    digest = "sha256:" + "c" * 64
    rows = [
        index.Row(-1, "", index.DIR, 0o555, 0, "", "", 0),
        index.Row(0, "up", index.LINK, 0o777, 0, "", str(tmp_path), 0),
        index.Row(1, "escaped", index.FILE, 0o444, 3, digest, "", 0),
    ]
    with pytest.raises(errors.InvalidArgument, match="parent is no directory"):
        overlay._write(index.Index(digest, rows, {0: {"up": 1}, 1: {"escaped": 2}}), tmp_path / "t")
    assert not (tmp_path / "escaped").exists()


def test_a_tree_too_large_for_the_metadata_tmpfs_is_resource_exhausted_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    store = FileStore(tmp_path / "store")
    rows = [index.Row(-1, "", index.DIR, 0o555, 0, "", "", 0)]
    for n in range(12):
        digest = store.put_bytes(f"file {n}".encode())
        rows.append(index.Row(0, f"f{n}", index.FILE, 0o444, len(f"file {n}"), digest, "", 0))
    children = {0: {row.name: position for position, row in enumerate(rows) if position}}
    tree_index = index.Index("sha256:" + "d" * 64, rows, children)
    meta = overlay.MetaTrees(tmp_path / "meta", store)
    meta.root.mkdir()
    real = mounter.Mounter()
    real.mount_tmpfs(meta.root, "mode=0700,nr_inodes=8")
    try:
        meta._mounted = True
        with pytest.raises(errors.ResourceExhausted, match="does not fit"):
            meta.build("d" * 64, tree_index, image="example/big:v1")
        assert list(meta.root.iterdir()) == []  # no staging left, no half tree
    finally:
        real.detach(meta.root)


def test_a_restarted_plugin_adopts_an_overlay_whose_record_was_lost(
    plugin: csi_helpers.PluginProcess, node: csi_pb2_grpc.NodeStub, registry: RegistryServer
) -> None:
    image, volume, expected = _published_then_killed(plugin, node, registry, "kernelspeed/adopt")
    (plugin.state_dir / "holders" / holders.file_name(volume)).unlink()  # its record lost
    plugin.start()
    logged(plugin.log, "adopting an overlay without a record")
    assert csi_helpers.tree(Path(volume)) == expected  # its metadata was kept, not swept
    _republished_and_unpublished(plugin, image, volume)
