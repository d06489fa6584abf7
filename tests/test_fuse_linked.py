"""FUSE mode's linked presentation: fully fetched trees as read-only binds of hard links.

Through the real plugin process, a real registry and real mounts (bind mounts, the FUSE
mount of a holder the test starts and stops by pid). What is checked: a fully fetched
tree is a read-only bind of a directory whose files are hard links into the file store,
with bind mode's content, modes and times (a cross-mode check); identical files of two
versions share one inode, a file that differs only in its mode does not; a ``kill -9``
of the plugin while it links a tree leaves no tree a publish would serve, and the
restarted plugin removes the leftovers; a linked tree no volume holds is removed and
its store variants collected; hostile tar members are refused as in bind mode; where
the linked trees' directory is another filesystem than the store's, the overlay serves
and the plugin says so once. The
tree builder's refusal of names and digests an index should never hold is checked
without mounts.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from pathlib import Path

import grpc
import pytest

from csi import mounter
from csi.fuse import index, linked, overlay
from csi.fuse.filestore import FileStore
from csi.proto import csi_pb2_grpc
from rukpak.common import errors
from tests import csi_helpers
from tests.fuse_helpers import fuse_plugin_fixture, publish_bind_and_fuse, publish_fuse
from tests.polling import logged, until
from tests.registry import RegistryServer

pytestmark = [pytest.mark.registry]

plugin = fuse_plugin_fixture()
node = csi_helpers.node_fixture(scope="function")


def _entries(n: int = 20, *, changed: int = -1) -> list[csi_helpers.Entry]:
    entries: list[csi_helpers.Entry] = [("manifests/", "dir"), ("empty/", "dir", None, 0o700)]
    for i in range(n):
        body = f"kind: ConfigMap # {i}{' changed' if i == changed else ''}\n".encode() * (i + 1)
        entries.append((f"manifests/{i:04}.yaml", "file", body))
    entries += [
        ("manifests/link.yaml", "symlink", "0001.yaml"),
        ("bin/run", "file", b"#!/bin/sh\n", 0o755),
        ("bin/same-as-run", "file", b"#!/bin/sh\n", 0o644),
    ]
    return entries


def _mount_on(path: str) -> mounter.MountInfo | None:
    return mounter.find(mounter.Mounter().mounts(), Path(path))


def _store(plugin: csi_helpers.PluginProcess) -> Path:
    return plugin.state_dir / "fuse" / "store"


def _linked(plugin: csi_helpers.PluginProcess) -> list[str]:
    return sorted(p.name for p in (_store(plugin) / "linked").iterdir())


def _variants(plugin: csi_helpers.PluginProcess) -> list[str]:
    """The store's further variants: copies for another mode or mtime of a content."""
    return sorted(p.name for p in (_store(plugin) / "variants").iterdir())


def _linked_inodes(plugin: csi_helpers.PluginProcess) -> set[int]:
    """The store's inodes (stored files, whose inode is a content's first variant, and
    further variants) that a linked tree links: a link beyond the store's own name."""
    store = _store(plugin)
    stored = [*(store / "files" / "sha256").iterdir(), *(store / "variants").iterdir()]
    return {st.st_ino for st in map(os.stat, stored) if st.st_nlink >= 2}


def _nothing_linked(plugin: csi_helpers.PluginProcess) -> bool | None:
    """No linked tree links the store any more, and its further variants are collected."""
    return (_variants(plugin) == [] and not _linked_inodes(plugin)) or None


def _metadata(root: Path) -> dict[str, tuple[int, int, int]]:
    """path → (mode, size, mtime) of every entry but symlinks, the root included
    (bind mode keeps no symlink or directory times: a directory's mtime is 0 here)."""
    out = {".": _meta_of(root)}
    for path in sorted(root.rglob("*")):
        if not path.is_symlink():
            out[path.relative_to(root).as_posix()] = _meta_of(path)
    return out


def _meta_of(path: Path) -> tuple[int, int, int]:
    st = os.lstat(path)
    if path.is_dir():
        return (st.st_mode, 0, 0)
    return (st.st_mode, st.st_size, int(st.st_mtime))


def test_a_fetched_tree_is_a_read_only_bind_of_hard_links_with_bind_modes_tree(
    plugin: csi_helpers.PluginProcess, node: csi_pb2_grpc.NodeStub, registry: RegistryServer
) -> None:
    image = csi_helpers.push_image(registry.host, "linked/same", "v1", [_entries()]).ref
    bind_target, fuse_target = publish_bind_and_fuse(plugin, node, image)
    mount = _mount_on(fuse_target)
    assert mount is not None and mount.fstype not in ("overlay", "fuse", "fuse.rukpak")
    assert {"ro", "nosuid", "nodev"} <= set(mount.options)
    assert mount.root.endswith(f"/linked/{_linked(plugin)[0]}")
    assert "presentation=linked" in plugin.log()
    # The cross-mode check: content, links, and every entry's mode, size and mtime.
    assert csi_helpers.tree(Path(fuse_target)) == csi_helpers.tree(Path(bind_target))
    assert _metadata(Path(fuse_target)) == _metadata(Path(bind_target))
    # Each file is a hard link to a stored inode: the store's variant of its content
    # (the stored file itself, for the content's first mode and mtime).
    ours = os.stat(Path(fuse_target, "manifests/0003.yaml"))
    assert ours.st_ino in _linked_inodes(plugin) and ours.st_nlink >= 2
    assert _variants(plugin) != []  # bin/same-as-run: bin/run's content in another mode
    csi_helpers.assert_read_only(Path(fuse_target, "manifests/new.yaml"))
    for how in (os.O_WRONLY, os.O_RDWR | os.O_TRUNC):
        with pytest.raises(OSError) as raised:
            os.open(Path(fuse_target, "manifests/0000.yaml"), how)
        assert raised.value.errno == errno.EROFS
    with pytest.raises(OSError) as raised:
        os.chmod(Path(fuse_target, "bin/run"), 0o777)
    assert raised.value.errno == errno.EROFS
    # Publishing twice is OK; the last unpublish removes the mount and the linked tree.
    node.NodePublishVolume(csi_helpers.publish_request(fuse_target, image, publishMode="fuse"))
    second = publish_fuse(plugin, node, image)
    csi_helpers.unpublish(node, fuse_target)
    assert _linked(plugin) != []  # still presented by the second volume
    csi_helpers.unpublish(node, second)
    assert _mount_on(fuse_target) is None and _mount_on(second) is None
    assert _linked(plugin) == []


def test_two_versions_share_the_inodes_of_unchanged_files_and_not_of_changed_ones(
    plugin: csi_helpers.PluginProcess, node: csi_pb2_grpc.NodeStub, registry: RegistryServer
) -> None:
    v1 = csi_helpers.push_image(registry.host, "linked/versions", "v1", [_entries()]).ref
    v2 = csi_helpers.push_image(registry.host, "linked/versions", "v2", [_entries(changed=5)]).ref
    one, two = publish_fuse(plugin, node, v1), publish_fuse(plugin, node, v2)
    assert len(_linked(plugin)) == 2

    def inode(root: str, rel: str) -> int:
        return os.stat(Path(root, rel)).st_ino

    for rel in ("manifests/0004.yaml", "manifests/0006.yaml", "bin/run"):
        assert inode(one, rel) == inode(two, rel), rel
    assert inode(one, "manifests/0005.yaml") != inode(two, "manifests/0005.yaml")
    assert Path(two, "manifests/0005.yaml").read_text().startswith("kind: ConfigMap # 5 changed")


def test_a_file_differing_only_in_mode_gets_an_inode_of_its_own(
    plugin: csi_helpers.PluginProcess, node: csi_pb2_grpc.NodeStub, registry: RegistryServer
) -> None:
    image = csi_helpers.push_image(registry.host, "linked/modes", "v1", [_entries()]).ref
    bind_target, fuse_target = publish_bind_and_fuse(plugin, node, image)
    run, same = os.stat(Path(fuse_target, "bin/run")), os.stat(Path(fuse_target, "bin/same-as-run"))
    assert run.st_ino != same.st_ino  # the same bytes, another mode
    assert (run.st_mode & 0o777, same.st_mode & 0o777) == (
        os.stat(Path(bind_target, "bin/run")).st_mode & 0o777,
        os.stat(Path(bind_target, "bin/same-as-run")).st_mode & 0o777,
    )
    assert run.st_mode & 0o111 and not same.st_mode & 0o111
    stored = [p for p in (_store(plugin) / "files" / "sha256").iterdir()
              if p.read_bytes() == b"#!/bin/sh\n"]  # fmt: skip
    assert len(stored) == 1  # one stored content, two variants of it


def test_a_kill_9_while_linking_leaves_no_tree_to_serve_and_the_restart_cleans_up(
    plugin: csi_helpers.PluginProcess, node: csi_pb2_grpc.NodeStub, registry: RegistryServer
) -> None:
    entries: list[csi_helpers.Entry] = [
        (f"d{i // 500}/f{i:05}", "file", f"file {i}\n".encode()) for i in range(6000)
    ]
    image = csi_helpers.push_image(registry.host, "linked/killed", "v1", [entries]).ref
    # Pulled (and its files hashed) by a first publish, so the next one only links.
    csi_helpers.unpublish(node, publish_fuse(plugin, node, image))
    assert _linked(plugin) == []
    linked_dir = _store(plugin) / "linked"
    seen: list[str] = []
    volume = csi_helpers.target(plugin)

    def publish() -> None:
        with contextlib.suppress(grpc.RpcError):  # the plugin dies under it: expected
            node.NodePublishVolume(csi_helpers.publish_request(volume, image, publishMode="fuse"))

    thread = threading.Thread(target=publish)
    thread.start()
    while thread.is_alive() and not seen:
        seen = [n for n in os.listdir(linked_dir) if n.startswith(linked.STAGING)]
    plugin.kill()
    thread.join(timeout=30)
    assert seen, "the plugin finished linking before the test saw its staging directory"
    assert [n for n in os.listdir(linked_dir) if not n.startswith(linked.STAGING)] == []
    assert _mount_on(volume) is None
    plugin.start()
    assert _linked(plugin) == []  # the half-built tree is gone
    with grpc.insecure_channel(f"unix://{plugin.socket}") as channel:
        again = csi_pb2_grpc.NodeStub(channel)
        again.NodePublishVolume(csi_helpers.publish_request(volume, image, publishMode="fuse"))
        assert len(list(Path(volume).rglob("f*"))) == 6000
        assert Path(volume, "d11/f05999").read_text() == "file 5999\n"
        csi_helpers.unpublish(again, volume)
    assert _linked(plugin) == []
    until(lambda: _nothing_linked(plugin), timeout=30, what="nothing linked")


def test_an_unheld_linked_tree_is_removed_and_its_variants_collected(
    plugin: csi_helpers.PluginProcess, node: csi_pb2_grpc.NodeStub, registry: RegistryServer
) -> None:
    image = csi_helpers.push_image(registry.host, "linked/collected", "v1", [_entries()]).ref
    kept = publish_fuse(plugin, node, image)
    gone = publish_fuse(
        plugin,
        node,
        csi_helpers.push_image(
            registry.host, "linked/collected", "v2", [_entries(3, changed=1)]
        ).ref,
    )
    assert len(_linked(plugin)) == 2
    before = _linked_inodes(plugin)  # v2's changed file is the one inode only it links
    # A crash, then the volume's mount goes without the plugin (as on a node reboot).
    plugin.kill()
    mounter.Mounter().unmount(Path(gone))
    plugin.start()
    logged(plugin.log, "dropping record of a vanished FUSE mount")
    (left,) = _linked(plugin)  # the unheld tree was swept; the held one stays
    assert _mount_on(kept) is not None and _mount_on(kept).root.endswith(left)  # type: ignore[union-attr]
    until(lambda: len(_linked_inodes(plugin)) == len(before) - 1 or None, timeout=30, what="sweep")
    kept_inodes = {os.stat(p).st_ino for p in Path(kept).rglob("*") if p.is_file()}
    assert kept_inodes == _linked_inodes(plugin)  # what the held tree links is never collected
    assert Path(kept, "manifests/0019.yaml").read_bytes().count(b"ConfigMap") == 20
    with grpc.insecure_channel(f"unix://{plugin.socket}") as channel:
        csi_helpers.unpublish(csi_pb2_grpc.NodeStub(channel), kept)
    assert _linked(plugin) == []
    until(lambda: _nothing_linked(plugin), timeout=30, what="all variants collected")


def test_hostile_tar_members_are_refused_as_in_bind_mode(
    tmp_path: Path,
    plugin: csi_helpers.PluginProcess,
    node: csi_pb2_grpc.NodeStub,
    registry: RegistryServer,
) -> None:
    outside = tmp_path / "outside"
    entries: list[csi_helpers.Entry] = [
        ("ok.yaml", "file", b"kind: ConfigMap\n"),
        ("../escape.yaml", "file", b"evil\n"),
        ("dir/../../escape2.yaml", "file", b"evil\n"),
        ("up", "symlink", "../../../../../.."),
        ("up/through-link.yaml", "file", b"evil\n"),
        ("abs", "symlink", str(outside)),
        ("abs/through-abs.yaml", "file", b"evil\n"),
        ("hard", "hardlink", "/etc/passwd"),
        ("setuid", "file", b"#!/bin/sh\n", 0o4755),
        ("fifo", "fifo"),
    ]
    image = csi_helpers.push_image(registry.host, "linked/hostile", "v1", [entries]).ref
    bind_target, fuse_target = publish_bind_and_fuse(plugin, node, image)
    assert "presentation=linked" in plugin.log()
    assert csi_helpers.tree(Path(fuse_target)) == csi_helpers.tree(Path(bind_target))
    assert _metadata(Path(fuse_target)) == _metadata(Path(bind_target))
    assert Path(fuse_target, "ok.yaml").read_text() == "kind: ConfigMap\n"
    assert not os.stat(Path(fuse_target, "setuid")).st_mode & 0o7000
    assert not outside.exists()
    assert not any(tmp_path.rglob("escape*.yaml"))  # nowhere: not in the tree, not outside
    assert not any(Path("/").glob("escape*.yaml"))


# --- the builder, without mounts -------------------------------------------------------


def _trees(tmp_path: Path) -> tuple[linked.LinkedTrees, FileStore]:
    store = FileStore(tmp_path / "store")
    return linked.LinkedTrees(store.root / "linked", store, overlay.Verifier(store)), store


@pytest.mark.parametrize("name", ["a/b", "..", ".", ""])
def test_the_link_builder_refuses_names_that_are_not_plain_and_leaves_nothing(
    tmp_path: Path, name: str
) -> None:
    trees, store = _trees(tmp_path)
    digest = store.put_bytes(b"abc")
    rows = [
        index.Row(-1, "", index.DIR, 0o555, 0, "", "", 0),
        index.Row(0, name, index.FILE, 0o444, 3, digest, "", 0),
    ]
    with pytest.raises(errors.InvalidArgument, match="not a plain name"):
        trees.build("e" * 64, index.Index(digest, rows, {0: {name: 1}}), image="x/y:v1")
    assert list(trees.root.iterdir()) == []  # no staging left, no half tree
    assert not (tmp_path / "b").exists()


def test_the_link_builder_never_creates_below_a_symlink(tmp_path: Path) -> None:
    trees, store = _trees(tmp_path)
    digest = store.put_bytes(b"abc")
    rows = [
        index.Row(-1, "", index.DIR, 0o555, 0, "", "", 0),
        index.Row(0, "up", index.LINK, 0o777, 0, "", str(tmp_path), 0),
        index.Row(1, "escaped", index.FILE, 0o444, 3, digest, "", 0),
    ]
    tree_index = index.Index(digest, rows, {0: {"up": 1}, 1: {"escaped": 2}})
    with pytest.raises(errors.InvalidArgument, match="parent is no directory"):
        trees.build("f" * 64, tree_index, image="x/y:v1")
    assert not (tmp_path / "escaped").exists()
    assert list(trees.root.iterdir()) == []


def test_a_tree_naming_a_file_the_store_lacks_is_data_loss_and_builds_nothing(
    tmp_path: Path,
) -> None:
    trees, _ = _trees(tmp_path)
    digest = "sha256:" + "1" * 64
    rows = [
        index.Row(-1, "", index.DIR, 0o555, 0, "", "", 0),
        index.Row(0, "f", index.FILE, 0o444, 3, digest, "", 0),
    ]
    with pytest.raises(errors.DataLoss, match="lacks 1 file"):
        trees.build("a" * 64, index.Index(digest, rows, {0: {"f": 1}}), image="x/y:v1")
    assert list(trees.root.iterdir()) == []


def test_where_hard_links_into_the_store_are_impossible_the_overlay_serves_logged_once(
    plugin: csi_helpers.PluginProcess, node: csi_pb2_grpc.NodeStub, registry: RegistryServer
) -> None:
    image = csi_helpers.push_image(registry.host, "linked/fallback", "v1", [_entries()]).ref
    elsewhere = _store(plugin) / "linked"  # another filesystem on the linked trees' path
    plugin.stop()
    real = mounter.Mounter()
    real.mount_tmpfs(elsewhere, "mode=0700")
    try:
        plugin.start()
        with grpc.insecure_channel(f"unix://{plugin.socket}") as channel:
            again = csi_pb2_grpc.NodeStub(channel)
            bind_target = csi_helpers.target(plugin)
            again.NodePublishVolume(
                csi_helpers.publish_request(bind_target, image, publishMode="bind")
            )
            first, second = publish_fuse(plugin, again, image), publish_fuse(plugin, again, image)
            for volume in (first, second):
                mount = _mount_on(volume)
                assert mount is not None and mount.fstype == "overlay"
                assert csi_helpers.tree(Path(volume)) == csi_helpers.tree(Path(bind_target))
            assert plugin.log().count("on different filesystems") == 1
            assert list(elsewhere.iterdir()) == []
            for volume in (first, second, bind_target):
                csi_helpers.unpublish(again, volume)
    finally:
        plugin.stop()
        real.detach(elsewhere)
