"""Layer extraction: formats, whiteouts, and a table of hostile archives."""

from __future__ import annotations

import gzip
import io
import os
import stat
import tarfile
from pathlib import Path

import pytest

from rukpak.common import errors
from rukpak.image import extract
from rukpak.image import tree as image_tree
from tests.csi_helpers import Entry, tree, write_layer


def unpack(
    tmp_path: Path, *layers: list[Entry], kind: str = "gzip", **limits: int
) -> tuple[Path, extract.ExtractStats]:
    root = tmp_path / "root"
    root.mkdir()
    paths = [
        extract.Layer(write_layer(tmp_path, f"layer{i}", entries, kind=kind))
        for i, entries in enumerate(layers)
    ]
    stats = extract.extract_layers(
        root, paths, image="example/img:1", limits=extract.Limits(**limits)
    )
    return root, stats


BASIC: list[Entry] = [
    ("manifests/", "dir"),
    ("manifests/01_ns.yaml", "file", b"kind: Namespace"),
    ("manifests/bin/run", "file", b"#!/bin/sh", 0o755),
    ("link", "symlink", "manifests/01_ns.yaml"),
    ("hard", "hardlink", "manifests/01_ns.yaml"),
]


@pytest.mark.parametrize("kind", ["gzip", "zstd", "none"])
def test_each_compression_unpacks_the_same_tree(tmp_path: Path, kind: str) -> None:
    root, stats = unpack(tmp_path, BASIC, kind=kind)
    assert tree(root) == {
        "hard": "file:kind: Namespace",
        "link": "-> manifests/01_ns.yaml",
        "manifests": "dir",
        "manifests/01_ns.yaml": "file:kind: Namespace",
        "manifests/bin": "dir",
        "manifests/bin/run": "file:#!/bin/sh",
    }
    assert stats.warnings == []
    assert stats.entries == 5


@pytest.mark.parametrize(
    ("media_type", "head", "expected"),
    [
        ("application/vnd.oci.image.layer.v1.tar+gzip", b"", "gzip"),
        ("application/vnd.docker.image.rootfs.diff.tar.gzip", b"", "gzip"),
        ("application/vnd.oci.image.layer.v1.tar+zstd", b"", "zstd"),
        ("application/vnd.oci.image.layer.v1.tar", b"\x1f\x8b", "none"),
        ("", b"\x1f\x8b\x08\x00", "gzip"),
        ("", b"\x28\xb5\x2f\xfd", "zstd"),
        ("application/octet-stream", b"abcd", "none"),
    ],
)
def test_compression_comes_from_the_media_type_then_magic_bytes(
    media_type: str, head: bytes, expected: str
) -> None:
    assert extract.compression_of(media_type, head) == expected


def test_later_layers_replace_files_and_whiteouts_delete(tmp_path: Path) -> None:
    lower = [("a/", "dir"), ("a/x", "file", b"1"), ("a/y", "file", b"2"), ("b", "file", b"3")]
    upper = [("a/.wh.x", "file"), ("b", "file", b"new"), (".wh.nothing", "file")]
    root, stats = unpack(tmp_path, lower, upper)
    assert tree(root) == {"a": "dir", "a/y": "file:2", "b": "file:new"}
    assert stats.warnings == []


def test_opaque_whiteout_hides_lower_content_but_keeps_this_layers(tmp_path: Path) -> None:
    lower = [("d/old", "file", b"o"), ("d/sub/older", "file", b"o"), ("keep", "file", b"k")]
    upper = [
        ("d/sub/new", "file", b"n"),
        ("d/.wh..wh..opq", "file"),
        ("d/later", "file", b"l"),
    ]
    root, _ = unpack(tmp_path, lower, upper)
    assert tree(root) == {
        "d": "dir",
        "d/later": "file:l",
        "d/sub": "dir",
        "d/sub/new": "file:n",
        "keep": "file:k",
    }


def test_opaque_whiteout_in_the_first_layer_keeps_that_layers_content(tmp_path: Path) -> None:
    only = [("d/a", "file", b"a"), ("d/.wh..wh..opq", "file"), ("d/b", "file", b"b")]
    root, _ = unpack(tmp_path, only, [("d/c", "file", b"c"), ("d/.wh..wh..opq", "file")])
    # the second layer's marker hides the first layer's files, the first layer's hid nothing
    assert tree(root) == {"d": "dir", "d/c": "file:c"}
    (tmp_path / "one").mkdir()
    root, _ = unpack(tmp_path / "one", only)
    assert tree(root) == {"d": "dir", "d/a": "file:a", "d/b": "file:b"}


def test_a_file_replacing_a_directory_and_back(tmp_path: Path) -> None:
    root, _ = unpack(
        tmp_path, [("p/q", "file", b"1")], [("p", "file", b"now a file")], [("p/", "dir")]
    )
    assert tree(root) == {"p": "dir"}


def test_rewriting_a_hardlinked_file_does_not_change_its_twin(tmp_path: Path) -> None:
    lower = [("a", "file", b"original"), ("b", "hardlink", "a")]
    root, _ = unpack(tmp_path, lower, [("b", "file", b"changed")])
    assert (root / "a").read_bytes() == b"original"
    assert (root / "b").read_bytes() == b"changed"


def test_absolute_names_are_made_relative_and_reported(tmp_path: Path) -> None:
    root, stats = unpack(tmp_path, [("/etc/thing", "file", b"x"), ("./ok", "file", b"y")])
    assert tree(root) == {"etc": "dir", "etc/thing": "file:x", "ok": "file:y"}
    assert [w for w in stats.warnings if "'/etc/thing'" in w and "absolute" in w]


def _raw_layer(tmp_path: Path, archive: bytes) -> extract.Layer:
    path = tmp_path / "raw.tar.gz"
    path.write_bytes(gzip.compress(archive, mtime=0))
    return extract.Layer(path)


@pytest.mark.parametrize(
    ("fmt", "what"),
    [(tarfile.PAX_FORMAT, "pax extended header"), (tarfile.GNU_FORMAT, "GNU long name")],
)
def test_an_oversized_long_name_header_refuses_the_layer_before_it_is_read(
    tmp_path: Path, fmt: int, what: str
) -> None:
    name = "d/" * 40_000 + "f"  # 80 KB of path: over the 64 KiB header cap
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        info = tarfile.TarInfo(name)
        tar.addfile(info, io.BytesIO(b""))
    root = tmp_path / "root"
    root.mkdir()
    with pytest.raises(errors.InvalidArgument) as caught:
        extract.extract_layers(root, [_raw_layer(tmp_path, buf.getvalue())], image="img:1")
    message = caught.value.message
    assert what in message and "65536" in message
    assert len(message) < 1000  # the attacker's name is cut short, never echoed whole
    assert os.listdir(root) == []


@pytest.mark.parametrize(
    "name",
    ["a/" * 2000 + "f", "a/" * 129 + "f", "x" * 200 + "/" + "y" * 4000],
    ids=["2000 components", "129 components", "4201 bytes"],
)
def test_paths_deeper_or_longer_than_the_limits_refuse_the_layer(tmp_path: Path, name: str) -> None:
    with pytest.raises(errors.InvalidArgument, match="rebuild the image with shallower paths"):
        unpack(tmp_path, [(name, "file", b"x")])
    assert os.listdir(tmp_path / "root") == []


def test_tree_walks_are_iterative_whatever_the_depth(tmp_path: Path) -> None:
    root = tmp_path / "deep"
    root.mkdir()
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(3000):  # deeper than the recursion limit and than PATH_MAX allows by name
        os.mkdir("d", dir_fd=fd)
        child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = child
    os.close(fd)
    assert sum(1 for _ in image_tree.walk(root)) == 3001
    image_tree.seal_dirs(root)
    assert stat.S_IMODE(root.stat().st_mode) == 0o555
    image_tree.remove(root)
    assert not root.exists()


def test_absolute_symlink_targets_are_rewritten_inside_the_tree(tmp_path: Path) -> None:
    root, _ = unpack(tmp_path, [("a/b/link", "symlink", "/etc/passwd"), ("top", "symlink", "/x")])
    assert os.readlink(root / "a/b/link") == "../../etc/passwd"
    assert os.readlink(root / "top") == "x"


# A table of hostile archives: each entry is refused (skipped and reported) and
# nothing appears outside the root. ``outside`` is a sibling of the root that
# an escape would write into.
HOSTILE: dict[str, list[list[Entry]]] = {
    "dotdot name": [[("../outside/evil", "file", b"x")]],
    "dotdot in the middle": [[("a/../../outside/evil", "file", b"x")]],
    "symlink target above root": [[("esc", "symlink", "../outside")]],
    "symlink to dotdot deep": [[("a/b/esc", "symlink", "../../../outside/evil")]],
    "write through a symlinked dir": [
        [("a/", "dir"), ("a/d", "symlink", "..")],
        [("a/d/evil", "file", b"x")],
    ],
    "write through an in-tree symlinked dir": [
        [("real/", "dir"), ("alias", "symlink", "real"), ("alias/evil", "file", b"x")]
    ],
    "hardlink to outside": [[("h", "hardlink", "../outside/secret")]],
    "hardlink to a missing entry": [[("h", "hardlink", "nope")]],
    "hardlink to a directory": [[("d/", "dir"), ("h", "hardlink", "d")]],
    "hardlink through a symlink": [
        [("s", "symlink", "."), ("h", "hardlink", "s/s/../outside/secret")]
    ],
    "fifo": [[("f", "fifo")]],
    "character device": [[("c", "chr")]],
    "whiteout through a symlink": [[("s", "symlink", "."), ("s/.wh.x", "file")]],
    "whiteout of dotdot": [[("a/.wh...", "file")]],
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_entries_are_refused_and_reported(tmp_path: Path, case: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"secret")
    root, stats = unpack(tmp_path, *HOSTILE[case])
    assert stats.warnings, "a refused entry must be reported"
    assert sorted(p.name for p in outside.iterdir()) == ["secret"]
    assert (outside / "secret").read_bytes() == b"secret"
    for path in root.rglob("*"):
        assert "evil" not in path.name
        if path.is_symlink():
            assert not image_tree.escapes(root, path.relative_to(root).parts)


def test_a_symlink_chain_that_escapes_is_removed_in_the_final_pass(tmp_path: Path) -> None:
    # Each link alone stays inside; followed together they climb out of the root.
    layer: list[Entry] = [("s", "symlink", "."), ("l", "symlink", "s/..")]
    root, stats = unpack(tmp_path, layer)
    assert not (root / "l").is_symlink()
    assert (root / "s").is_symlink()
    assert any("outside the image" in w for w in stats.warnings)


def test_setuid_setgid_and_sticky_bits_are_stripped(tmp_path: Path) -> None:
    root, stats = unpack(
        tmp_path, [("suid", "file", b"x", 0o6755), ("sticky/", "dir", None, 0o1777)]
    )
    assert stat.S_IMODE((root / "suid").stat().st_mode) == 0o555
    assert not (root / "sticky").stat().st_mode & 0o7000
    assert any("setuid" in w for w in stats.warnings)


def test_too_many_bytes_is_resource_exhausted_naming_image_and_budget(tmp_path: Path) -> None:
    with pytest.raises(errors.ResourceExhausted, match=r"example/img:1.*1000 bytes"):
        unpack(tmp_path, [("big", "file", b"x" * 2000)], max_bytes=1000)


def test_too_many_files_is_resource_exhausted(tmp_path: Path) -> None:
    entries: list[Entry] = [(f"f{i}", "file", b"") for i in range(20)]
    with pytest.raises(errors.ResourceExhausted, match="more than 10 files"):
        unpack(tmp_path, entries, max_entries=10)


def test_a_big_declared_file_stops_before_any_data_is_written(tmp_path: Path) -> None:
    layer: list[Entry] = [("big", "file", b"\0" * (4 << 20))]
    with pytest.raises(errors.ResourceExhausted):
        unpack(tmp_path, layer, max_bytes=1 << 20)
    assert not (tmp_path / "root" / "big").exists()


def test_a_decompression_bomb_in_tar_headers_stops_early(tmp_path: Path) -> None:
    # A pax header that declares 64 MiB: tarfile would read it all into memory;
    # the header cap refuses it by its declared size, before reading (64 MiB of
    # zeros gzip to ~64 KiB).
    header = tarfile.TarInfo("pax")
    header.type = tarfile.XHDTYPE
    header.size = 64 << 20
    bomb = tmp_path / "bomb"
    with gzip.open(bomb, "wb") as out:
        out.write(header.tobuf(format=tarfile.USTAR_FORMAT))
        chunk = b"\0" * (1 << 20)
        for _ in range(64):
            out.write(chunk)
    root = tmp_path / "root"
    root.mkdir()
    with pytest.raises(errors.InvalidArgument, match=r"pax extended header 'pax' holds 67108864"):
        extract.extract_layers(
            root, [extract.Layer(bomb)], image="bomb", limits=extract.Limits(1000, 10)
        )


@pytest.mark.parametrize("junk", [b"not a tar at all" * 40, b"\x1f\x8b\x08\x00garbage"])
def test_unreadable_layer_data_is_invalid_argument(tmp_path: Path, junk: bytes) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (tmp_path / "junk").write_bytes(junk)
    with pytest.raises(errors.InvalidArgument, match="not a readable tar"):
        extract.extract_layers(root, [extract.Layer(tmp_path / "junk")], image="junk")


def test_seal_makes_the_tree_read_only_and_unseal_reverses_it(tmp_path: Path) -> None:
    root, _ = unpack(tmp_path, BASIC)
    image_tree.seal(root)
    assert stat.S_IMODE(root.stat().st_mode) == 0o555
    assert stat.S_IMODE((root / "manifests").stat().st_mode) == 0o555
    assert stat.S_IMODE((root / "manifests/01_ns.yaml").stat().st_mode) == 0o444
    assert stat.S_IMODE((root / "manifests/bin/run").stat().st_mode) == 0o555
    image_tree.unseal(root)
    assert stat.S_IMODE((root / "manifests").stat().st_mode) == 0o755


def test_files_are_created_read_only_and_seal_dirs_finishes_the_tree(tmp_path: Path) -> None:
    root, _ = unpack(tmp_path, BASIC)
    assert stat.S_IMODE((root / "manifests/01_ns.yaml").stat().st_mode) == 0o444
    assert stat.S_IMODE((root / "manifests/bin/run").stat().st_mode) == 0o555
    assert stat.S_IMODE((root / "manifests").stat().st_mode) == 0o755  # still writable
    image_tree.seal_dirs(root)
    assert stat.S_IMODE(root.stat().st_mode) == 0o555
    assert stat.S_IMODE((root / "manifests").stat().st_mode) == 0o555
    assert stat.S_IMODE((root / "manifests/bin").stat().st_mode) == 0o555


def test_later_layers_replace_read_only_files_and_whole_directories(tmp_path: Path) -> None:
    root, stats = unpack(
        tmp_path,
        [("d/", "dir"), ("d/sub/", "dir"), ("d/sub/f", "file", b"old"), ("d/g", "file", b"g")],
        [("d/sub", "file", b"now a file"), ("d/g", "file", b"new"), ("d/sub2/f", "file", b"2")],
        [("d/.wh.sub", "file", b""), ("d/sub/x", "file", b"again a dir")],
    )
    assert tree(root) == {
        "d": "dir",
        "d/g": "file:new",
        "d/sub": "dir",
        "d/sub/x": "file:again a dir",
        "d/sub2": "dir",
        "d/sub2/f": "file:2",
    }
    assert stats.warnings == []


def test_a_directory_replaced_by_a_symlink_mid_layer_is_never_written_through(
    tmp_path: Path,
) -> None:
    # The extractor remembers directory descriptors; replacing one must forget them.
    root, stats = unpack(
        tmp_path,
        [
            ("a/", "dir"),
            ("a/f", "file", b"f"),
            ("b/", "dir"),
            ("a", "symlink", "b"),
            ("a/g", "file", b"through the link"),
        ],
    )
    assert tree(root) == {"a": "-> b", "b": "dir"}
    assert any("'a/g'" in w and "symlink" in w for w in stats.warnings)


def test_whiteouts_and_refused_entries_count_against_the_entry_budget(tmp_path: Path) -> None:
    entries: list[Entry] = [(f".wh.f{i}", "file") for i in range(8)] + [("x", "fifo")] * 4
    with pytest.raises(errors.ResourceExhausted):
        unpack(tmp_path, entries, max_entries=10)
