"""plain+v0 bundle loading: layout rules and errors that name file, document and line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from provisioner.engine.bundle import formats
from provisioner.engine.errors import BundleInvalid


def bundle(tmp_path: Path, files: dict[str, str]) -> Path:
    (tmp_path / "manifests").mkdir()
    for name, text in files.items():
        (tmp_path / "manifests" / name).write_text(text)
    return tmp_path


CM = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {}\n"


def test_files_are_read_in_name_order_and_documents_in_file_order(tmp_path: Path) -> None:
    root = bundle(
        tmp_path,
        {"b.yaml": CM.format("b1") + "---\n" + CM.format("b2"), "a.yaml": CM.format("a")},
    )
    loaded = formats.load(root)
    assert [m.ref.name for m in loaded.manifests] == ["a", "b1", "b2"]
    assert [(m.source.file, m.source.document, m.source.line) for m in loaded.manifests] == [
        ("manifests/a.yaml", 1, 1),
        ("manifests/b.yaml", 1, 1),
        ("manifests/b.yaml", 2, 6),
    ]


def test_json_files_and_v1_lists_contribute_objects(tmp_path: Path) -> None:
    root = bundle(
        tmp_path,
        {
            "a.json": '{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "j"}}',
            "b.yaml": "apiVersion: v1\nkind: List\nitems:\n- "
            + CM.format("x").replace("\n", "\n  "),
        },
    )
    assert [m.ref.name for m in formats.load(root).manifests] == ["j", "x"]


def test_empty_documents_volume_links_and_empty_dotfiles_hold_no_object(tmp_path: Path) -> None:
    files = {"a.yaml": "---\n" + CM.format("a") + "---\n", ".gitkeep": "", "..data": "junk: ["}
    root = bundle(tmp_path, files)
    assert [m.ref.name for m in formats.load(root).manifests] == ["a"]


def test_a_dotfile_is_content_as_upstream_reads_it(tmp_path: Path) -> None:
    """Upstream's plain loader reads every file of manifests/: a dotfile of text is a bad
    document, in upstream's words (its suite checks them)."""
    root = bundle(tmp_path, {"a.yaml": CM.format("a"), ".keep": "keep this directory"})
    with pytest.raises(BundleInvalid, match="json: cannot unmarshal string into Go value"):
        formats.load(root)
    (tmp_path / "b").mkdir()
    root = bundle(tmp_path / "b", {"a.yaml": CM.format("a"), ".extra.yaml": CM.format("b")})
    assert [m.ref.name for m in formats.load(root).manifests] == ["b", "a"]


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({}, "invalid bundle: found zero objects: plain+v0 bundles are required to contain"),
        ({"a.yaml": "---\n"}, "found zero objects"),
        ({"README.md": "# hi"}, "manifests/README.md: only .yaml, .yml and .json files"),
        (
            {"a.yaml": CM.format("a") + "---\nkind: a: b\n"},
            "manifests/a.yaml document 2 (line 6): invalid YAML: mapping values",
        ),
        (
            {"a.json": '{"apiVersion": \n  "v1",, }'},
            "manifests/a.json document 1 (line 2): invalid JSON",
        ),
        (
            {"a.yaml": "- 1\n- 2\n"},
            'unable to decode "manifests/a.yaml": json: cannot unmarshal array into Go value '
            "of type map[string]interface {} (document 1, line 1: expected an object)",
        ),
        ({"a.yaml": "kind: ConfigMap\nmetadata: {name: a}\n"}, "apiVersion is missing"),
        ({"a.yaml": "apiVersion: v1\nkind: ConfigMap\n"}, "ConfigMap has no metadata"),
        (
            {"a.yaml": "apiVersion: v1\nkind: Pod\nmetadata: {generateName: p-}\n"},
            "uses generateName",
        ),
        (
            {"a.yaml": CM.format("a"), "b.yaml": CM.format("a")},
            "defined twice (first in manifests/a",
        ),
    ],
)
def test_bad_bundles_are_refused_naming_the_place(
    tmp_path: Path, files: dict[str, str], message: str
) -> None:
    root = bundle(tmp_path, files)
    with pytest.raises(BundleInvalid, match=re.escape(message)):
        formats.load(root)


def test_a_bundle_without_a_manifests_directory_is_refused_in_upstreams_words(
    tmp_path: Path,
) -> None:
    with pytest.raises(BundleInvalid) as refused:
        formats.load(tmp_path)
    assert refused.value.message == (
        "get objects from bundle manifests: readdir manifests: file does not exist"
    )


def test_subdirectories_are_refused_in_upstreams_words(tmp_path: Path) -> None:
    root = bundle(tmp_path, {"namespace-a.yaml": CM.format("a")})
    (root / "manifests" / "emptydir").mkdir()
    (root / "manifests" / "subdir").mkdir()
    with pytest.raises(BundleInvalid) as refused:
        formats.load(root)
    assert refused.value.message == (
        "get objects from bundle manifests: subdirectories are not allowed within the "
        '"manifests" directory of the bundle image filesystem: found "manifests/emptydir"'
    )


def test_an_empty_manifests_directory_is_refused_in_upstreams_words(tmp_path: Path) -> None:
    with pytest.raises(BundleInvalid) as refused:
        formats.load(bundle(tmp_path, {".gitignore": ""}))
    assert "found zero objects: plain+v0 bundles are required to contain at least one object" in (
        refused.value.message
    )


def test_a_gitignore_among_the_manifests_reads_as_gos_decoder_refuses_it(tmp_path: Path) -> None:
    """Upstream's invalid ConfigMap bundle: a ``.gitignore`` holding ``!.gitignore`` (a YAML
    local tag, which Go's YAML reads as the string "") beside a valid manifest."""
    root = bundle(tmp_path, {".gitignore": "!.gitignore\n", "namespace-a.yaml": CM.format("a")})
    with pytest.raises(BundleInvalid) as refused:
        formats.load(root)
    assert "json: cannot unmarshal string into Go value" in refused.value.message
    assert refused.value.message == (
        'get objects from bundle manifests: unable to decode "manifests/.gitignore": json: '
        "cannot unmarshal string into Go value of type map[string]interface {} "
        "(document 1, line 1: expected an object)"
    )


def test_local_yaml_tags_on_objects_are_read_as_untagged(tmp_path: Path) -> None:
    root = bundle(tmp_path, {"a.yaml": "!thing\n" + CM.format("a") + "data: !x {k: !y v}\n"})
    (loaded,) = formats.load(root).manifests
    assert loaded.obj["data"] == {"k": "v"}


def test_unknown_formats_are_refused_and_new_ones_can_register(tmp_path: Path) -> None:
    with pytest.raises(BundleInvalid, match="unknown bundle format 'nope'"):
        formats.load(tmp_path, format="nope")
    empty = formats.Bundle(format="test+v0", manifests=())
    formats.register("test+v0", lambda root: empty)
    assert formats.load(tmp_path, format="test+v0") is empty
    assert "plain+v0" in formats.names()
