"""The FUSE store's tags, one small file per tag (``csi.fuse.tags``), on real files.

A tag change writes its one file by rename; a process killed mid-write leaves whole
records; a torn or garbage record is logged and ignored; the ``tags.json`` of the
format before is migrated once at start, so an upgraded node keeps its tags. The
store (``csi.fuse.images.FuseImages``) resolves ``IfNotPresent`` from them after a
restart without asking the registry.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from csi.fuse import tags
from csi.fuse.images import FuseImages
from rukpak.image.seams import Puller, PullPolicy
from rukpak.oci.auth import Credentials
from rukpak.oci.client import RegistryClient
from rukpak.oci.manifest import Platform
from tests.csi_helpers import simple_image
from tests.registry import RegistryServer

AMD64 = Platform.parse("linux/amd64")
A = "sha256:" + "a" * 64
B = "sha256:" + "b" * 64


def records(root: Path) -> list[Path]:
    return sorted(root.glob("*.json"))


def test_a_tag_is_one_file_naming_its_key_and_digest(tmp_path: Path) -> None:
    store = tags.Tags(tmp_path)
    store.set("r.example/app:v1|linux/amd64", A)
    store.set("r.example/app:v2|linux/amd64", B)
    first = tmp_path / tags.file_name("r.example/app:v1|linux/amd64")
    assert json.loads(first.read_bytes()) == {"key": "r.example/app:v1|linux/amd64", "digest": A}
    assert len(records(tmp_path)) == 2
    assert tags.Tags(tmp_path).all() == {
        "r.example/app:v1|linux/amd64": A,
        "r.example/app:v2|linux/amd64": B,
    }


def test_a_change_rewrites_only_its_own_file(tmp_path: Path) -> None:
    store = tags.Tags(tmp_path)
    store.set("one", A)
    store.set("two", A)
    other = tmp_path / tags.file_name("two")
    before = other.stat().st_ino
    store.set("one", B)
    assert other.stat().st_ino == before  # untouched: not rewritten by rename
    assert tags.Tags(tmp_path).get("one") == B


def test_setting_the_same_digest_writes_nothing(tmp_path: Path) -> None:
    store = tags.Tags(tmp_path)
    store.set("one", A)
    path = tmp_path / tags.file_name("one")
    inode = path.stat().st_ino
    store.set("one", A)  # pullPolicy Always resolving what it resolved before
    assert path.stat().st_ino == inode


def test_forgetting_a_tree_removes_the_files_of_its_tags(tmp_path: Path) -> None:
    store = tags.Tags(tmp_path)
    store.set("one", A)
    store.set("two", A)
    store.set("three", B)
    assert sorted(store.forget_tree("a" * 64)) == ["one", "two"]
    assert [p.name for p in records(tmp_path)] == [tags.file_name("three")]
    assert tags.Tags(tmp_path).all() == {"three": B}


@pytest.mark.parametrize(
    "content",
    [
        b'{"key": "one", "dig',  # torn mid-write by a power loss
        b"\x00\x00\x00\x00",  # blocks never written back
        b'["not", "a", "record"]',
        b'{"key": "one", "digest": "not-a-digest"}',
        b'{"key": 7, "digest": "' + A.encode() + b'"}',
    ],
    ids=["torn", "zeros", "not-an-object", "bad-digest", "key-not-a-string"],
)
def test_a_torn_or_garbage_record_is_ignored_with_a_log_line(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    tags.Tags(tmp_path).set("two", B)
    (tmp_path / tags.file_name("one")).write_bytes(content)
    with caplog.at_level(logging.ERROR):
        store = tags.Tags(tmp_path)
    assert store.all() == {"two": B}
    assert any(str(tmp_path / tags.file_name("one")) in r.getMessage() for r in caplog.records)
    store.set("one", A)  # resolved again, written whole
    assert tags.Tags(tmp_path).all() == {"one": A, "two": B}


def test_a_record_under_another_keys_name_is_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / tags.file_name("one")).write_text(json.dumps({"key": "two", "digest": A}))
    with caplog.at_level(logging.ERROR):
        assert tags.Tags(tmp_path).all() == {}
    assert "tag record is not one" in caplog.text


WRITER = """
import sys
from pathlib import Path
from csi.fuse import tags
store = tags.Tags(Path(sys.argv[1]))
digests = ["sha256:" + "a" * 64, "sha256:" + "b" * 64]
n = 0
while True:
    for i in range(50):
        store.set(f"key-{i}|" + "x" * 2000, digests[n % 2])
    n += 1
    if n == 3:
        print("writing", flush=True)
"""


def test_a_writer_killed_mid_write_leaves_whole_records(tmp_path: Path) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parent.parent,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"writing\n"  # it is rewriting records now
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait()
    store = tags.Tags(tmp_path)
    assert len(store.all()) == 50  # every record whole: the old or the new digest
    assert set(store.all().values()) <= {A, B}
    assert not list(tmp_path.glob("*.bad-*"))


def test_an_old_tags_json_is_migrated_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    legacy = tmp_path / "tags.json"
    legacy.write_text(json.dumps({"r/app:v1|linux/amd64": A, "r/app:v2|linux/amd64": B}))
    with caplog.at_level(logging.INFO):
        store = tags.Tags(tmp_path / "tags", legacy=legacy)
    assert store.all() == {"r/app:v1|linux/amd64": A, "r/app:v2|linux/amd64": B}
    assert not legacy.exists()
    assert len(records(tmp_path / "tags")) == 2
    assert "tags taken over from tags.json" in caplog.text
    store.set("r/app:v1|linux/amd64", B)
    # Opened again (the next start): the records, not the old file, are what counts.
    assert tags.Tags(tmp_path / "tags", legacy=legacy).get("r/app:v1|linux/amd64") == B


def test_a_migration_interrupted_before_the_old_file_went_runs_again(tmp_path: Path) -> None:
    legacy = tmp_path / "tags.json"
    legacy.write_text(json.dumps({"one": A, "two": B}))
    tags.Tags(tmp_path / "tags").set("one", B)  # newer than the old file: kept
    store = tags.Tags(tmp_path / "tags", legacy=legacy)
    assert store.all() == {"one": B, "two": B}
    assert not legacy.exists()


def test_a_torn_old_tags_json_is_set_aside_and_the_store_starts_empty(tmp_path: Path) -> None:
    legacy = tmp_path / "tags.json"
    legacy.write_bytes(b'{"one": "sha256:aa')
    assert tags.Tags(tmp_path / "tags", legacy=legacy).all() == {}
    assert not legacy.exists()
    assert len(list(tmp_path.glob("tags.json.bad-*"))) == 1


@pytest.mark.registry
def test_an_upgraded_store_resolves_if_not_present_from_its_old_tags(
    tmp_path: Path, registry: RegistryServer
) -> None:
    image = simple_image(registry.host, "tags/upgrade")

    def client(credentials: Credentials | None) -> Puller:
        return RegistryClient(credentials=credentials, retries=0, timeout=10)

    first = FuseImages(tmp_path, puller_factory=client)
    ready = first.ensure(image.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT)
    key = f"{image.ref}|{AMD64}"
    assert tags.Tags(tmp_path / "tags").get(key) == ready.digest == image.manifest_digest
    # The node as an older version left it: one tags.json, no per-tag records.
    for path in records(tmp_path / "tags"):
        path.unlink()
    (tmp_path / "tags.json").write_text(json.dumps({key: ready.digest}))

    def offline(credentials: Credentials | None) -> Puller:
        raise AssertionError("a tag the store knows is not resolved again")

    upgraded = FuseImages(tmp_path, puller_factory=offline)
    again = upgraded.ensure(image.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT)
    assert again.cache_hit and again.digest == image.manifest_digest
    assert not (tmp_path / "tags.json").exists()
