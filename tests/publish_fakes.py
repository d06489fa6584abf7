"""Fakes for the publish core: mount tables in memory and a puller that must not be used.

Where it sits: tests of ``csi.node.publish`` and of the bundle sources that publish
without a registry or real mounts (``test_csi_publish``, ``test_fuse_publish``,
``test_publish_deadline_core``, ``test_source_git``, ``test_source_http``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from csi import mounter
from csi.node.publish import Publisher
from rukpak.image.cache import ImageCache
from rukpak.image.seams import Puller
from rukpak.oci.auth import Credentials


def no_network(credentials: Credentials | None) -> Puller:
    raise AssertionError("no registry in these tests")


class NoMounts:
    """A mount table that stays empty: for tests in which nothing may be mounted."""

    def mounts(self) -> list[mounter.MountInfo]:
        return []

    def bind_read_only(self, source: Path, target: Path) -> None:
        raise AssertionError("nothing is mounted in these tests")

    def unmount(self, target: Path) -> None:
        raise AssertionError("nothing is mounted in these tests")


class FakeMounter:
    def __init__(self) -> None:
        self.table: list[mounter.MountInfo] = []

    def mounts(self) -> list[mounter.MountInfo]:
        return list(self.table)

    def bind_read_only(self, source: Path, target: Path) -> None:
        self.table.append(mounter.MountInfo(str(target), str(source), ("ro",)))

    def unmount(self, target: Path) -> None:
        self.table = [m for m in self.table if m.mount_point != str(target)]


def offline_publisher(tmp_path: Path, **options: Any) -> Publisher:
    """A publisher over an empty image cache in ``tmp_path`` that may neither pull nor
    mount (``options`` go to ``Publisher``); ``tmp_path / "kubelet"`` is its kubelet dir."""
    (tmp_path / "kubelet").mkdir(exist_ok=True)
    images = ImageCache(tmp_path / "state", puller_factory=no_network)
    return Publisher(images=images, mounter=NoMounts(), kubelet_dir=tmp_path / "kubelet", **options)
