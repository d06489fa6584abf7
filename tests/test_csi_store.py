"""The content store: verified, atomic, idempotent puts; ingests invisible."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from rukpak.common import errors
from rukpak.image.store import ContentStore
from rukpak.oci import digest as digests

DATA = b"hello bundle"
DIGEST = digests.of(DATA)


def writer(data: bytes, calls: list[int] | None = None):  # type: ignore[no-untyped-def]
    def fetch(dest: Path) -> None:
        if calls is not None:
            calls.append(1)
        dest.write_bytes(data)

    return fetch


def test_put_stores_a_read_only_blob_by_digest(tmp_path: Path) -> None:
    store = ContentStore(tmp_path)
    path = store.put(DIGEST, len(DATA), writer(DATA))
    assert path == tmp_path / "blobs" / "sha256" / digests.hex_of(DIGEST)
    assert path.read_bytes() == DATA
    assert stat.S_IMODE(path.stat().st_mode) == 0o444
    assert store.has(DIGEST)
    assert list(store.ingest_dir.iterdir()) == []


def test_putting_existing_content_is_success_without_fetching(tmp_path: Path) -> None:
    store = ContentStore(tmp_path)
    calls: list[int] = []
    store.put(DIGEST, len(DATA), writer(DATA, calls))
    store.put(DIGEST, len(DATA), writer(DATA, calls))
    assert calls == [1]


@pytest.mark.parametrize(
    ("content", "size", "message"),
    [(b"tampered!!!!", len(DATA), "hashes to"), (DATA + b"x", len(DATA), "bytes")],
)
def test_content_that_does_not_match_is_data_loss_and_not_kept(
    tmp_path: Path, content: bytes, size: int, message: str
) -> None:
    store = ContentStore(tmp_path)
    with pytest.raises(errors.DataLoss, match=message):
        store.put(DIGEST, size, writer(content))
    assert not store.has(DIGEST)
    assert list(store.ingest_dir.iterdir()) == []


def test_a_failed_fetch_leaves_nothing_behind(tmp_path: Path) -> None:
    store = ContentStore(tmp_path)

    def broken(dest: Path) -> None:
        dest.write_bytes(DATA[:3])
        raise errors.Unavailable("registry went away")

    with pytest.raises(errors.Unavailable):
        store.put(DIGEST, len(DATA), broken)
    assert not store.has(DIGEST)
    assert list(store.ingest_dir.iterdir()) == []


def test_unfinished_ingests_are_removed_at_start(tmp_path: Path) -> None:
    ContentStore(tmp_path)
    (tmp_path / "ingest" / "abc-1234").mkdir()
    (tmp_path / "ingest" / "abc-1234" / "data").write_bytes(b"half")
    (tmp_path / "ingest" / "stray").write_bytes(b"half")
    store = ContentStore(tmp_path)
    assert list(store.ingest_dir.iterdir()) == []


@pytest.mark.parametrize("bad", ["sha256:../../etc/passwd", "md5:abcd", "sha256:ABC", "nodigest"])
def test_digests_that_could_name_other_paths_are_invalid_argument(tmp_path: Path, bad: str) -> None:
    with pytest.raises(errors.InvalidArgument):
        ContentStore(tmp_path).path(bad)


def test_delete_and_listing_report_sizes(tmp_path: Path) -> None:
    store = ContentStore(tmp_path)
    store.put_bytes(DIGEST, DATA)
    assert [b.digest for b in store.blobs()] == [DIGEST]
    assert store.total_size() == len(DATA)
    assert store.delete(DIGEST) == len(DATA)
    assert store.delete(DIGEST) == 0
