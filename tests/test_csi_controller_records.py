"""The Controller service's volume records (``csi.controller.volumes``) on bad state files.

A records file that cannot be read, or holds JSON of another shape, is kept aside under
``volumes.json.bad-<ns>`` with its bytes intact, and the next write starts a fresh file
instead of silently overwriting the only copy of the old records.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from csi.controller.volumes import VolumeRegistry, VolumeSpec


@pytest.mark.parametrize(
    "content",
    [b"{not json", b"\xff\xfe garbage", b'{"volumes": ["a list, not a map"]}', b"[1, 2]"],
    ids=["truncated JSON", "not UTF-8", "wrong shape", "a list"],
)
def test_unreadable_records_are_kept_aside_not_overwritten(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "volumes.json"
    path.write_bytes(content)
    registry = VolumeRegistry(path)
    registry.create(
        VolumeSpec(name="pvc-1", attributes={"image": "example.com/a@sha256:" + "0" * 64})
    )
    kept = list(tmp_path.glob("volumes.json.bad-*"))
    assert len(kept) == 1, sorted(p.name for p in tmp_path.iterdir())
    assert kept[0].read_bytes() == content
    assert list(json.loads(path.read_text())["volumes"]) != []


def test_good_records_load_and_nothing_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "volumes.json"
    first = VolumeRegistry(path)
    volume = first.create(VolumeSpec(name="pvc-2", attributes={"image": "example.com/b:v1"}))
    again = VolumeRegistry(path)
    assert (
        again.existing(VolumeSpec(name="pvc-2", attributes={"image": "example.com/b:v1"})) == volume
    )
    assert not list(tmp_path.glob("volumes.json.bad-*"))
