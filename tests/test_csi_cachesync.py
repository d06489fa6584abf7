"""Durability of committed trees off the publish path (``rukpak.store.commit``).

A real registry and a real cache directory: a committed tree's marker names this
boot until the background ``syncfs`` marks it ``synced``; at start, a tree that was
never synced and comes from another boot (as after a power loss) is removed and pulled
again, while one from this boot (a crashed plugin: the page cache kept it) is kept.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rukpak.image.cache import ImageCache
from rukpak.image.seams import Puller, PullPolicy
from rukpak.oci.auth import Credentials
from rukpak.oci.client import RegistryClient
from rukpak.oci.manifest import Platform
from rukpak.store import commit as cachesync
from tests.csi_helpers import simple_image
from tests.polling import eventually
from tests.registry import RegistryServer

pytestmark = pytest.mark.registry

AMD64 = Platform.parse("linux/amd64")


def client(credentials: Credentials | None) -> Puller:
    return RegistryClient(credentials=credentials, retries=0, timeout=5)


def _marker(tree: Path) -> Path:
    return tree.with_name(tree.name + ".sealed")


def _read(path: Path) -> dict[str, Any]:
    doc = json.loads(path.read_text())
    assert isinstance(doc, dict)
    return doc


def test_a_committed_tree_is_synced_in_the_background(
    tmp_path: Path, registry: RegistryServer
) -> None:
    image = simple_image(registry.host, "sync/background", text="kept")
    cache = ImageCache(tmp_path, puller_factory=client)
    got = cache.ensure(image.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT)
    marker = _read(_marker(got.path))
    assert marker["digest"] == image.manifest_digest
    assert marker["boot_id"] == cachesync.boot_id() != ""
    eventually(lambda: _read(_marker(got.path)).get("synced"), what="the marker to say synced")


@pytest.mark.parametrize(
    ("boot", "synced", "kept"),
    [
        ("another-boot", False, False),  # written before a power loss, never synced
        ("another-boot", True, True),  # synced before the reboot
        (None, False, True),  # this boot: the plugin crashed, the page cache kept it
    ],
)
def test_at_start_only_trees_unsynced_before_a_reboot_are_removed(
    tmp_path: Path, registry: RegistryServer, boot: str | None, synced: bool, kept: bool
) -> None:
    repo = f"sync/start-{boot or 'this'}-{synced}".lower()
    image = simple_image(registry.host, repo, text="content")
    got = ImageCache(tmp_path, puller_factory=client).ensure(
        image.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT
    )
    eventually(lambda: _read(_marker(got.path)).get("synced"), what="the first sync")
    marker = _read(_marker(got.path))
    marker["boot_id"] = boot or cachesync.boot_id()
    marker.pop("synced", None)
    if synced:
        marker["synced"] = True
    _marker(got.path).write_text(json.dumps(marker))

    again = ImageCache(tmp_path, puller_factory=client)

    assert got.path.exists() == kept
    pulled = again.ensure(image.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT)
    assert pulled.cache_hit == kept
    assert (pulled.path / "manifests/cm.yaml").read_text() == "content"
    eventually(lambda: _read(_marker(pulled.path)).get("synced"), what="the tree to be synced")
