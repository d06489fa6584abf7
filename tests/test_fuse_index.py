"""File-level store and tree index: layers become an index of digests, under bind mode's rules."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from csi.fuse import index, unpack
from csi.fuse.filestore import FileStore
from rukpak.common import errors
from rukpak.image import extract
from rukpak.image.layerio import Layer


def _layer(path: Path, entries: list[tuple[str, str, bytes | str]], *, mode: int = 0o644) -> Layer:
    """Write a tar.gz whose entries are (kind, name, data-or-linkname)."""
    with tarfile.open(path, "w:gz") as tar:
        for kind, name, data in entries:
            info = tarfile.TarInfo(name)
            info.mode = mode
            info.mtime = 1_700_000_000
            if kind == "f":
                assert isinstance(data, bytes)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
                continue
            info.type = {
                "d": tarfile.DIRTYPE,
                "l": tarfile.SYMTYPE,
                "h": tarfile.LNKTYPE,
                "c": tarfile.CHRTYPE,
            }[kind]
            if kind in ("l", "h"):
                assert isinstance(data, str)
                info.linkname = data
            tar.addfile(info)
    return Layer(path, "application/vnd.oci.image.layer.v1.tar+gzip", "")


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    return FileStore(tmp_path / "store")


def _row(idx: index.Index, path: str) -> index.Row:
    row = idx.lookup(path)
    assert row is not None, path
    return idx.rows[row]


def test_identical_files_are_stored_once(tmp_path: Path, store: FileStore) -> None:
    layer = _layer(
        tmp_path / "l.tgz",
        [("f", "manifests/a.yaml", b"same"), ("f", "manifests/b.yaml", b"same"), ("f", "c", b"x")],
    )
    root, stats = unpack.build(store, [layer], image="img")
    idx = index.from_rows("sha256:" + "0" * 64, index.flatten(root))
    a, b = _row(idx, "manifests/a.yaml"), _row(idx, "manifests/b.yaml")
    assert a.digest == b.digest and a.size == 4 and a.mode == 0o444
    assert _row(idx, "manifests").kind == index.DIR and _row(idx, "manifests").mode == 0o555
    assert sorted(store.digests()) == sorted({a.digest, _row(idx, "c").digest})
    assert store.path(a.digest).read_bytes() == b"same"
    assert stats.entries == 3


def test_hostile_entries_are_refused_as_in_bind_mode(tmp_path: Path, store: FileStore) -> None:
    layer = _layer(
        tmp_path / "l.tgz",
        [
            ("f", "../escape", b"no"),
            ("f", "/abs/file", b"yes"),
            ("l", "up", "../../etc"),
            ("l", "abslink", "/abs/file"),
            ("d", "dir", b""),
            ("l", "dir/hop", ".."),
            ("l", "chain", "dir/hop/.."),
            ("f", "up/inside", b"no"),
            ("c", "dev", b""),
            ("h", "hard", "abs/file"),
            ("h", "hard2", "abslink"),
        ],
    )
    root, stats = unpack.build(store, [layer], image="img")
    idx = index.from_rows("sha256:" + "0" * 64, index.flatten(root))
    assert idx.lookup("escape") is None
    assert _row(idx, "up").kind == index.DIR  # the link was refused; up/inside made a dir
    assert _row(idx, "abs/file").digest
    assert _row(idx, "abslink").target == "abs/file"
    assert idx.lookup("chain") is None  # resolves above the root through dir/hop
    assert _row(idx, "dir/hop").target == ".."
    assert idx.lookup("dev") is None
    assert _row(idx, "hard").digest == _row(idx, "abs/file").digest
    assert idx.lookup("hard2") is None
    text = " ".join(stats.warnings)
    for expected in ("'..'", "points outside", "device nodes", "not a regular file", "resolves"):
        assert expected in text


def test_whiteouts_and_opaque_dirs_delete_lower_layers(tmp_path: Path, store: FileStore) -> None:
    lower = _layer(
        tmp_path / "1.tgz",
        [("f", "keep", b"k"), ("f", "gone", b"g"), ("f", "opq/old", b"o"), ("f", "opq/x", b"x")],
    )
    upper = _layer(
        tmp_path / "2.tgz",
        [("f", ".wh.gone", b""), ("f", "opq/new", b"n"), ("f", "opq/.wh..wh..opq", b"")],
    )
    root, _ = unpack.build(store, [lower, upper], image="img")
    idx = index.from_rows("sha256:" + "0" * 64, index.flatten(root))
    assert idx.lookup("keep") is not None and idx.lookup("gone") is None
    assert sorted(idx.children[_row_id(idx, "opq")]) == ["new"]


def test_opaque_marker_in_the_first_layer_hides_nothing(tmp_path: Path, store: FileStore) -> None:
    only: list[tuple[str, str, bytes | str]] = [
        ("f", "d/a", b"a"),
        ("f", "d/.wh..wh..opq", b""),
        ("f", "d/b", b"b"),
    ]
    root, _ = unpack.build(store, [_layer(tmp_path / "1.tgz", only)], image="img")
    idx = index.from_rows("sha256:" + "0" * 64, index.flatten(root))
    assert sorted(idx.children[_row_id(idx, "d")]) == ["a", "b"]
    upper = _layer(tmp_path / "2.tgz", [("f", "d/c", b"c"), ("f", "d/.wh..wh..opq", b"")])
    root, _ = unpack.build(store, [_layer(tmp_path / "1.tgz", only), upper], image="img")
    idx = index.from_rows("sha256:" + "0" * 64, index.flatten(root))
    assert sorted(idx.children[_row_id(idx, "d")]) == ["c"]


def _row_id(idx: index.Index, path: str) -> int:
    row = idx.lookup(path)
    assert row is not None
    return row


def test_budgets_stop_bombs(tmp_path: Path, store: FileStore) -> None:
    layer = _layer(tmp_path / "l.tgz", [("f", f"f{i}", b"1234") for i in range(10)])
    with pytest.raises(errors.ResourceExhausted, match="more than 5 files"):
        unpack.build(store, [layer], image="img", limits=extract.Limits(max_entries=5))
    with pytest.raises(errors.ResourceExhausted, match="more than 20 bytes"):
        unpack.build(store, [layer], image="img", limits=extract.Limits(max_bytes=20))


def test_saved_index_loads_with_the_same_rows(tmp_path: Path, store: FileStore) -> None:
    layer = _layer(tmp_path / "l.tgz", [("f", "a/b", b"1"), ("l", "a/c", "b")])
    root, _ = unpack.build(store, [layer], image="img")
    saved = index.save(tmp_path / "t.json", "sha256:" + "1" * 64, root, files=store)
    loaded = index.load(tmp_path / "t.json", store)
    assert loaded.rows == saved.rows and loaded.children == saved.children
    (tmp_path / "t.json").write_text("{}")
    with pytest.raises(errors.DataLoss, match="unreadable"):
        index.load(tmp_path / "t.json", store)


def test_ingest_with_a_wrong_expected_digest_keeps_nothing(store: FileStore) -> None:
    with (
        pytest.raises(errors.DataLoss, match="hashes to"),
        store.ingest(expect="sha256:" + "2" * 64) as sink,
    ):
        sink.write(b"data")
    assert list(store.digests()) == [] and list(store.ingest_dir.iterdir()) == []
    digest = store.put_bytes(b"data")
    assert store.verify(digest)
    store.path(digest).chmod(0o644)
    store.path(digest).write_bytes(b"evil")
    assert not store.verify(digest)


def test_a_directory_that_leaves_the_tree_takes_nothing_added_after(
    tmp_path: Path, store: FileStore
) -> None:
    """The builder remembers the directory of the last lookup: entries that follow a
    directory replaced by a file, or whited out, land in the tree as it is now."""
    lower = _layer(tmp_path / "1.tgz", [("f", "a/b/one", b"1"), ("f", "w/old", b"o")])
    upper = _layer(
        tmp_path / "2.tgz",
        [("f", "w/x", b"x"), ("f", ".wh.w", b""), ("f", "w/new", b"n"), ("f", "a/b", b"file")],
    )
    later = _layer(tmp_path / "3.tgz", [("f", "a/b/two", b"2")])
    root, stats = unpack.build(store, [lower, upper, later], image="img")
    idx = index.from_rows("sha256:" + "0" * 64, index.flatten(root))
    assert _row(idx, "a/b").kind == index.FILE
    assert idx.lookup("a/b/one") is None and idx.lookup("a/b/two") is None
    assert any("'a/b/two'" in w and "not a directory" in w for w in stats.warnings), stats
    assert sorted(idx.children[_row_id(idx, "w")]) == ["new"]


def test_versions_share_directory_listings_and_a_broken_document_is_data_loss(
    tmp_path: Path, store: FileStore
) -> None:
    def version(n: int) -> index.Node:
        builder = index.Builder(image="img")
        for d in range(3):
            for f in range(4):
                body = f"{d}/{f} {n if (d, f) == (2, 3) else ''}".encode()
                digest = store.put_bytes(body)
                builder.add_file((f"d{d}", f"f{f}"), mode=0o644, size=len(body), digest=digest,
                                 mtime=1)  # fmt: skip
        return builder.finish()

    before = set(store.digests())
    one = index.save(tmp_path / "1.json", "sha256:" + "1" * 64, version(1), files=store)
    listings_one = set(store.digests()) - before - {r.digest for r in one.files()}
    assert len(listings_one) == 4  # the root and its three directories
    two = index.save(tmp_path / "2.json", "sha256:" + "2" * 64, version(2), files=store)
    listings = set(store.digests()) - before - {r.digest for r in (*one.files(), *two.files())}
    assert len(listings) == 5  # only d2's listing differs
    assert index.load(tmp_path / "2.json", store).rows == two.rows
    doc_two = json.loads((tmp_path / "2.json").read_text())
    named = set(index.named_files(doc_two, store, set()))  # what the collector keeps
    assert named == {r.digest for r in two.files()} | {f"sha256:{d}" for d in doc_two["dirs"]}
    # The first format (rows inline) still loads.
    v1 = {"version": 1, "digest": "sha256:" + "1" * 64, "rows": [list(r) for r in one.rows]}
    (tmp_path / "v1.json").write_text(json.dumps(v1))
    assert index.load(tmp_path / "v1.json", store).rows == one.rows
    # Broken documents and listings: DataLoss naming the document, nothing read outside.
    doc = json.loads((tmp_path / "1.json").read_text())
    outside = tmp_path / "outside.json"
    outside.write_text("[]")
    cases = {
        "missing": [*doc["dirs"][:-1], "9" * 64],
        "not a sha256": [*doc["dirs"][:-1], "../../outside.json"],
        "fewer": doc["dirs"][:-1],
        "more": [*doc["dirs"], doc["dirs"][0]],
    }
    for what, dirs in cases.items():
        (tmp_path / "bad.json").write_text(json.dumps({**doc, "dirs": dirs}))
        with pytest.raises(errors.DataLoss, match="unreadable"):
            index.load(tmp_path / "bad.json", store)
            pytest.fail(what)
    damaged = store.path(f"sha256:{doc['dirs'][1]}")
    damaged.chmod(0o644)
    damaged.write_text("[]")  # not what its name says
    with pytest.raises(errors.DataLoss, match="damaged"):
        index.load(tmp_path / "1.json", store)
