"""The ``plain+v0`` bundle format: a ``manifests/`` directory of YAML or JSON files.

Rules (upstream RukPak's): the bundle root contains ``manifests/``; it has no
subdirectories and only ``.yaml``, ``.yml`` or ``.json`` files; each file holds
one or more documents; the bundle holds at least one object. Files are read in
name order and documents in file order, so the result is deterministic;
``ordering`` sorts by kind phase afterwards. Kubernetes' ``..data`` volume links are
skipped; other dotfiles are read as YAML (upstream reads every file), without the suffix
rule. A ``v1 List`` document contributes its
items. ``provisioner.bundle.validate`` runs this same loader at build time;
``formats`` lists it as the default format.

Its refusals are upstream's words (``words``): no ``manifests/``, a subdirectory, zero
objects, a document that is not an object (YAML tags upstream's decoder does not know,
such as a ``.gitignore``'s ``!.gitignore``, read as plain values, as Go's YAML reads
them); every other refusal carries upstream's prefix (``get objects from bundle
manifests: ``) before our words. The unpack pod (v1alpha1) and the instance run
(v1alpha2) both load with it, so both API versions say the same.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from provisioner.engine.bundle import words, yamlbounds
from provisioner.engine.bundle.manifest import Bundle, Manifest, Source
from provisioner.engine.errors import BundleInvalid
from provisioner.engine.objects import ObjectRef

NAME = "plain+v0"
SUFFIXES = (".yaml", ".yml", ".json")


def load(root: Path, *, dotfiles: bool = True) -> Bundle:
    """The bundle at ``root``; ``dotfiles=False`` reads it as ``rukpak bundle build`` packs
    it (dotfiles left out of the image)."""
    manifests_dir = root / words.MANIFESTS_DIR
    if not manifests_dir.is_dir():
        raise BundleInvalid(words.MISSING_MANIFESTS)
    manifests: list[Manifest] = []
    for rel, path in manifest_entries(manifests_dir):
        if not dotfiles and path.name.startswith("."):
            continue
        if path.is_dir():
            raise BundleInvalid(words.subdirectory(rel))
        try:
            manifests.extend(_read(rel, path))
        except BundleInvalid as err:
            raise BundleInvalid(words.MANIFESTS_PREFIX + err.message) from None
    if not manifests:
        raise BundleInvalid(words.ZERO_OBJECTS)
    yamlbounds.check_count(len(manifests))
    try:
        _refuse_duplicates(manifests)
    except BundleInvalid as err:
        raise BundleInvalid(words.MANIFESTS_PREFIX + err.message) from None
    return Bundle(format=NAME, manifests=tuple(manifests))


def _read(rel: str, path: Path) -> list[Manifest]:
    """The manifests of one entry of ``manifests/`` (``rel`` names it in messages)."""
    if not path.is_file():
        raise BundleInvalid(f"{rel}: not a regular file")
    if not path.name.endswith(SUFFIXES) and not path.name.startswith("."):
        raise BundleInvalid(
            f"{rel}: only .yaml, .yml and .json files belong in manifests/; move it out"
        )
    yamlbounds.check_size(rel, path.stat().st_size)
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise BundleInvalid(f"{rel}: not UTF-8 text ({err})") from None
    return parse(rel, text)


def manifest_entries(manifests_dir: Path) -> Iterator[tuple[str, Path]]:
    """The entries of a bundle's ``manifests/`` in name order, each with its bundle-relative
    name (``manifests/NAME``). Kubernetes' volume links (``..data``, ``..2026_...``) are
    left out; other dotfiles are content, as upstream reads them (a ``.gitkeep`` holds
    no object, a dotfile of text is refused)."""
    for path in sorted(manifests_dir.iterdir(), key=lambda p: p.name):
        if not path.name.startswith(".."):
            yield f"manifests/{path.name}", path


def parse(file: str, text: str) -> list[Manifest]:
    """The manifests in one file's text; ``file`` is used only in messages."""
    if file.endswith(".json"):
        return _parse_json(file, text)
    return _parse_yaml(file, text)


def _parse_json(file: str, text: str) -> list[Manifest]:
    yamlbounds.check(file, text)  # JSON is YAML: the same bounds on size and nesting
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise BundleInvalid(
            f"{file} document 1 (line {err.lineno}): invalid JSON: {err.msg}"
        ) from None
    return _objects(doc, Source(file, 1, 1))


_BASE: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
"""libyaml's parser when PyYAML was built with it (about 10x faster), else the pure one."""


class _Loader(_BASE):  # type: ignore[valid-type,misc]
    """The safe loader, reading local tags (``!foo``) as Go's YAML does: the value as if
    untagged (a ``.gitignore`` line ``!.gitignore`` is the string "")."""


def _untagged(loader: yaml.SafeLoader, _suffix: str, node: yaml.Node) -> object:
    if isinstance(node, yaml.ScalarNode):
        return loader.construct_scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    assert isinstance(node, yaml.MappingNode)
    return loader.construct_mapping(node, deep=True)


_Loader.add_multi_constructor("!", _untagged)
_LOADER: type[yaml.SafeLoader] = _Loader


def _parse_yaml(file: str, text: str) -> list[Manifest]:
    yamlbounds.check(file, text)
    out: list[Manifest] = []
    loader = _LOADER(text)
    index = 0
    try:
        while loader.check_node():
            index += 1
            node = loader.get_node()
            if node is None:
                continue
            source = Source(file, index, node.start_mark.line + 1)
            out.extend(_objects(loader.construct_document(node), source))
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        line = mark.line + 1 if mark is not None else 0
        problem = err.problem or err.context or "invalid YAML"
        raise BundleInvalid(
            f"{file} document {max(index, 1)} (line {line}): invalid YAML: {problem}"
        ) from None
    except yaml.YAMLError as err:
        raise BundleInvalid(f"{file} document {max(index, 1)}: invalid YAML: {err}") from None
    finally:
        loader.dispose()
    return out


def _objects(doc: Any, source: Source) -> list[Manifest]:
    if doc is None:
        return []
    if not isinstance(doc, dict):
        # upstream's decoder words it so, and its suite checks those words
        where = f"document {source.document}, line {source.line}: expected an object"
        raise BundleInvalid(words.not_an_object(source.file, doc, where))
    if doc.get("apiVersion") == "v1" and doc.get("kind") == "List":
        items = doc.get("items") or []
        if not isinstance(items, list):
            raise BundleInvalid(f"{source}: List items must be a list")
        out: list[Manifest] = []
        for item in items:
            out.extend(_objects(item, source))
        return out
    _check_object(doc, source)
    return [Manifest(obj=doc, source=source)]


def _check_object(doc: dict[str, Any], source: Source) -> None:
    for key in ("apiVersion", "kind"):
        if not isinstance(doc.get(key), str) or not doc[key]:
            raise BundleInvalid(f"{source}: {key} is missing or not a string")
    meta = doc.get("metadata")
    if not isinstance(meta, dict):
        raise BundleInvalid(f"{source}: {doc['kind']} has no metadata")
    if "generateName" in meta and "name" not in meta:
        raise BundleInvalid(
            f"{source}: {doc['kind']} uses generateName; bundle objects need a fixed name"
        )
    if not isinstance(meta.get("name"), str) or not meta["name"]:
        raise BundleInvalid(f"{source}: {doc['kind']} has no metadata.name")
    namespace = meta.get("namespace")
    if namespace is not None and not isinstance(namespace, str):
        raise BundleInvalid(f"{source}: metadata.namespace must be a string")


def _refuse_duplicates(manifests: list[Manifest]) -> None:
    seen: dict[tuple[str, str, str, str], Manifest] = {}
    for m in manifests:
        key = ObjectRef.of(m.obj).identity
        first = seen.setdefault(key, m)
        if first is not m:
            raise BundleInvalid(f"{m.source}: {m.ref} is defined twice (first in {first.source})")
