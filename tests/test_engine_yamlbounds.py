"""Hostile manifest files refused by name, fast and in bounded memory
(``provisioner.engine.bundle.yamlbounds``, through the plain+v0 and registry+v1 loaders): alias
bombs, deep nesting, oversized files and bundles of too many objects; ordinary anchors
and large honest files still load."""

from __future__ import annotations

import resource
import time
from pathlib import Path

import pytest

from provisioner.engine.bundle import formats, formats_plain, yamlbounds
from provisioner.engine.errors import BundleInvalid


def billion_laughs(levels: int = 12) -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        refs = ",".join([f"*a{i - 1}"] * 10)
        lines.append(f"a{i}: &a{i} [{refs}]")
    return "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: bomb}\ndata:\n" + "\n".join(
        "  " + line for line in lines
    )


def bundle(root: Path, files: dict[str, str]) -> Path:
    (root / "manifests").mkdir(parents=True)
    for name, text in files.items():
        (root / "manifests" / name).write_text(text)
    return root


def test_an_alias_bomb_is_refused_quickly_without_expanding_it(tmp_path: Path) -> None:
    started = time.monotonic()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(BundleInvalid, match="excessive aliasing") as info:
        formats.load(bundle(tmp_path, {"bomb.yaml": billion_laughs()}), format="plain+v0")
    assert "manifests/bomb.yaml" in info.value.message
    assert time.monotonic() - started < 5, "the check must not expand the aliases"
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 200 * 1024, f"memory grew by {grown_kib} KiB"


def test_ordinary_anchors_still_load() -> None:
    text = (
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: d, labels: &l {app: x}}\n"
        "spec:\n  selector: {matchLabels: *l}\n  template: {metadata: {labels: *l}}\n"
    )
    (manifest,) = formats_plain.parse("manifests/a.yaml", text)
    assert manifest.obj["spec"]["template"]["metadata"]["labels"] == {"app": "x"}


@pytest.mark.parametrize("kind", ["yaml", "json"])
def test_nesting_deeper_than_the_bound_is_refused_with_its_line(kind: str) -> None:
    depth = yamlbounds.MAX_DEPTH + 5
    nested = "[" * depth + "]" * depth
    text = (
        f'{{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {{"name": "x"}}, "d": {nested}}}'
    )
    with pytest.raises(BundleInvalid, match=f"nested more than {yamlbounds.MAX_DEPTH} levels"):
        formats_plain.parse(f"manifests/deep.{kind}", text)


def test_a_hundred_thousand_levels_deep_is_refused_not_a_crash() -> None:
    nested = "[" * 100_000 + "]" * 100_000
    with pytest.raises(BundleInvalid, match=r"nested more than|exceeded maximum nesting depth"):
        formats_plain.parse("manifests/deep.yaml", f"d: {nested}\n")  # ours, or libyaml's


def test_an_oversized_file_is_refused_before_it_is_read(tmp_path: Path) -> None:
    root = bundle(tmp_path, {"big.yaml": "# nothing\n"})
    with (root / "manifests" / "big.yaml").open("r+b") as out:
        out.truncate(yamlbounds.MAX_FILE_BYTES + 1)  # sparse: no time spent writing it
    with pytest.raises(BundleInvalid, match="MiB a manifest file may hold") as info:
        formats.load(root, format="plain+v0")
    assert "manifests/big.yaml" in info.value.message


def test_too_many_objects_are_refused_by_count(tmp_path: Path) -> None:
    count = yamlbounds.MAX_OBJECTS + 1
    docs = "".join(
        f"---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: c{i}}}\n" for i in range(count)
    )
    with pytest.raises(BundleInvalid, match=f"holds {count} objects"):
        formats.load(bundle(tmp_path, {"many.yaml": docs}), format="plain+v0")


def test_a_large_honest_file_loads(tmp_path: Path) -> None:
    data = "".join(f"  k{i}: v{i}\n" for i in range(200))
    docs = "".join(
        f"---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: c{i}}}\ndata:\n{data}"
        for i in range(500)
    )
    loaded = formats.load(bundle(tmp_path, {"big.yaml": docs}), format="plain+v0")
    assert len(loaded.manifests) == 500


def test_a_syntax_error_keeps_its_own_words() -> None:
    with pytest.raises(BundleInvalid, match=r"document 1 \(line 2\): invalid YAML"):
        formats_plain.parse("manifests/bad.yaml", "a: b\n  c: [\n")
