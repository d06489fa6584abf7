"""An image's tree as an index: path → (kind, mode, size, file digest, link target).

Where it sits: the FUSE image cache (``csi.fuse.images``) builds one per image
manifest while it walks the layers' tar members (regular files' bytes go to
the file store, ``csi.fuse.filestore``); the FUSE filesystem (``csi.fuse.fs``)
loads the saved index and serves it. Nothing is written to a directory tree,
so the extraction rules of bind mode are applied here to an in-memory tree,
with the same helpers (``rukpak.image.members``): one check of every entry's
path (``members.check_entry``: ``..`` refused, depth and length within the
limits, leading ``/`` stripped and reported), symlink targets rewritten or
refused, symlinked or non-directory parents refused, hard links only to regular
files already in the tree, device nodes and fifos skipped, setuid/setgid/sticky
dropped (files 0444, or 0555 when executable; directories 0555), OCI whiteouts
applied, the same byte and entry budgets, and a final pass that drops symlinks
whose chain climbs out of the tree.

The saved form is one JSON document of flat rows in depth-first, name-sorted
order (row 0 is the root); a row's position is its stable local inode number,
which the filesystem needs to answer the kernel after a restart.
"""

from __future__ import annotations

import json
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from rukpak.common import errors
from rukpak.common.fsio import write_bytes_atomic
from rukpak.image import extract, members

DIR = "d"
FILE = "f"
LINK = "l"
FORMAT_VERSION = 1

Refused = members.Refused  # an entry that is skipped and reported, not a failure


@dataclass(slots=True)
class Node:
    kind: str
    mode: int
    size: int = 0
    digest: str = ""
    target: str = ""
    mtime: int = 0
    children: dict[str, Node] | None = None


def _new_dir(mtime: int = 0) -> Node:
    return Node(DIR, 0o555, mtime=mtime, children={})


@dataclass
class Builder:
    """Applies layer entries, in order, to an in-memory tree under the bind-mode rules."""

    image: str
    limits: extract.Limits = field(default_factory=extract.Limits)
    stats: extract.ExtractStats = field(default_factory=extract.ExtractStats)
    root: Node = field(default_factory=_new_dir)
    # What the current layer put in the tree, for opaque whiteouts; None in the first
    # layer, where everything in the tree is the current layer's (nothing to clear).
    _touched: set[tuple[str, ...]] | None = None
    _layers: int = 0

    def begin_layer(self) -> None:
        self._touched = set() if self._layers else None
        self._layers += 1

    def charge(self, size: int) -> None:
        """Count one entry (and its bytes) against the image's budgets."""
        self.stats.charge(size, self.limits, self.image)

    # --- the walk ---------------------------------------------------------------------

    def parent(self, parts: tuple[str, ...], *, create: bool) -> Node:
        """The directory holding ``parts[-1]``; refuses symlinked or non-directory parents."""
        node = self.root
        for comp in parts[:-1]:
            assert node.children is not None
            child = node.children.get(comp)
            if child is None:
                if not create:
                    raise Refused(f"parent {comp!r} does not exist")
                child = node.children[comp] = _new_dir()
            elif child.kind != DIR:
                raise Refused(f"parent {comp!r} is a symlink or not a directory")
            node = child
        return node

    def prepare(self, name: str, *, mode: int, kind: str) -> tuple[str, ...] | None:
        """Check an entry before its data is read; the parts to add it at, or None to skip.

        ``kind`` is one of DIR, FILE, LINK, "hardlink", "whiteout", or anything
        else for an unsupported type. Raises :data:`Refused` for skipped entries.
        """
        parts = members.check_entry(name, limits=self.limits, image=self.image, stats=self.stats)
        if not parts:
            return None
        if parts[-1].startswith(members.WHITEOUT_PREFIX):
            self.whiteout(parts)
            return None
        if kind not in (DIR, FILE, LINK, "hardlink"):
            raise Refused(kind)
        if mode & 0o7000:
            self.stats.warn(f"{name!r}: setuid/setgid/sticky bits removed")
        if self._touched is not None:
            for i in range(1, len(parts) + 1):
                self._touched.add(parts[:i])
        self.parent(parts, create=True)
        return parts

    def add_file(
        self, parts: tuple[str, ...], *, mode: int, size: int, digest: str, mtime: int
    ) -> None:
        node = Node(FILE, members.final_mode(mode), size=size, digest=digest, mtime=mtime)
        self.parent(parts, create=True).children[parts[-1]] = node  # type: ignore[index]

    def add_dir(self, parts: tuple[str, ...], *, mtime: int) -> None:
        children = self.parent(parts, create=True).children
        assert children is not None
        existing = children.get(parts[-1])
        if existing is not None and existing.kind == DIR:
            existing.mtime = mtime
            return
        children[parts[-1]] = _new_dir(mtime)

    def add_symlink(self, parts: tuple[str, ...], linkname: str, *, mtime: int) -> None:
        target = members.safe_symlink_target(parts, linkname)
        node = Node(LINK, 0o777, size=len(target.encode()), target=target, mtime=mtime)
        self.parent(parts, create=True).children[parts[-1]] = node  # type: ignore[index]
        self.stats.symlinks += 1

    def add_hardlink(self, parts: tuple[str, ...], linkname: str) -> None:
        link_parts = members.split_name(linkname)
        if not link_parts:
            raise Refused("hard link to the root directory")
        src = self.parent(link_parts, create=False).children.get(link_parts[-1])  # type: ignore[union-attr]
        if src is None:
            raise Refused(f"hard link target {linkname!r} does not exist")
        if src.kind != FILE:
            raise Refused(f"hard link target {linkname!r} is not a regular file")
        if link_parts == parts:
            return
        copy = Node(FILE, src.mode, size=src.size, digest=src.digest, mtime=src.mtime)
        self.parent(parts, create=True).children[parts[-1]] = copy  # type: ignore[index]

    def whiteout(self, parts: tuple[str, ...]) -> None:
        directory = self.parent(parts, create=True)
        assert directory.children is not None
        base = parts[-1]
        if base == members.OPAQUE_MARKER:
            if self._touched is not None:
                self._clear_opaque(directory, parts[:-1], self._touched)
            return
        target = base[len(members.WHITEOUT_PREFIX) :]
        if target in ("", ".", ".."):
            raise Refused("whiteout of an invalid name")
        directory.children.pop(target, None)

    def _clear_opaque(
        self, directory: Node, prefix: tuple[str, ...], touched: set[tuple[str, ...]]
    ) -> None:
        assert directory.children is not None
        for name in list(directory.children):
            path = (*prefix, name)
            child = directory.children[name]
            if path not in touched:
                del directory.children[name]
            elif child.kind == DIR:
                self._clear_opaque(child, path, touched)

    # --- the end --------------------------------------------------------------------

    def finish(self) -> Node:
        """Drop symlinks that resolve above the root (chains included); the finished tree."""
        if self.stats.symlinks:
            for parts in list(_links(self.root, ())):
                if escapes(self.root, parts):
                    self.parent(parts, create=False).children.pop(parts[-1])  # type: ignore[union-attr]
                    self.stats.warn(f"{'/'.join(parts)!r}: symlink resolves outside the image")
        return self.root


def _links(node: Node, prefix: tuple[str, ...]) -> Iterator[tuple[str, ...]]:
    for name, child in (node.children or {}).items():
        if child.kind == LINK:
            yield (*prefix, name)
        elif child.kind == DIR:
            yield from _links(child, (*prefix, name))


def _lookup(root: Node, parts: list[str]) -> Node | None:
    node: Node | None = root
    for comp in parts:
        if node is None or node.children is None:
            return None
        node = node.children.get(comp)
    return node


def escapes(root: Node, link: tuple[str, ...]) -> bool:
    """Whether the symlink at ``link`` resolves above ``root`` (as ``image.tree.escapes``)."""
    node = _lookup(root, list(link))
    assert node is not None and node.kind == LINK

    def probe(parts: list[str]) -> str | bool | None:
        found = _lookup(root, parts)
        if found is None:
            return None
        return found.target if found.kind == LINK else True

    return members.resolves_above(link, node.target, probe)


# --- the saved form -------------------------------------------------------------------


class Row(NamedTuple):
    """One entry of a saved index; its position in :attr:`Index.rows` is its local inode.

    A tuple, so a list of rows is JSON as it is (``save``) and comes back with
    ``Row(*fields)`` (``load``).
    """

    parent: int
    name: str
    kind: str
    mode: int
    size: int
    digest: str
    target: str
    mtime: int


@dataclass
class Index:
    """A loaded index: flat rows plus, per directory row, its children by name."""

    digest: str
    rows: list[Row]
    children: dict[int, dict[str, int]]

    def files(self) -> Iterator[Row]:
        return (r for r in self.rows if r.kind == FILE)

    def lookup(self, path: str) -> int | None:
        """The row of a slash-separated path relative to the root (tests, tools)."""
        row = 0
        for comp in (c for c in path.split("/") if c):
            nxt = self.children.get(row, {}).get(comp)
            if nxt is None:
                return None
            row = nxt
        return row


def flatten(root: Node) -> list[Row]:
    rows: list[Row] = [Row(-1, "", DIR, root.mode, 0, "", "", root.mtime)]

    def walk(node: Node, index: int) -> None:
        for name in sorted(node.children or {}):
            child = (node.children or {})[name]
            rows.append(
                Row(
                    index,
                    name,
                    child.kind,
                    child.mode,
                    child.size,
                    child.digest,
                    child.target,
                    child.mtime,
                )
            )
            if child.kind == DIR:
                walk(child, len(rows) - 1)

    walk(root, 0)
    return rows


def from_rows(digest: str, rows: list[Row]) -> Index:
    children: dict[int, dict[str, int]] = {}
    for i, row in enumerate(rows):
        if row.kind == DIR:
            children.setdefault(i, {})
        if i:
            children.setdefault(row.parent, {})[row.name] = i
    return Index(digest=digest, rows=rows, children=children)


def save(
    path: Path,
    digest: str,
    root: Node,
    *,
    extra: dict[str, Any] | None = None,
    durable: bool = True,
) -> Index:
    """Write the index of ``root`` atomically (and durably unless ``durable=False``);
    returns it loaded."""
    rows = flatten(root)
    doc = {
        "version": FORMAT_VERSION,
        "digest": digest,
        "rows": rows,
        **(extra or {}),
    }
    write_bytes_atomic(path, json.dumps(doc, separators=(",", ":")).encode(), durable=durable)
    return from_rows(digest, rows)


def load(path: Path) -> Index:
    """Read a saved index; DataLoss when it is not one this version wrote."""
    try:
        doc = json.loads(path.read_bytes())
        if doc.get("version") != FORMAT_VERSION:
            raise ValueError(f"format version {doc.get('version')!r}")
        rows = [Row(*r) for r in doc["rows"]]
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise errors.DataLoss(
            f"tree index {path} is unreadable ({exc}); delete it and publish again"
        ) from exc
    for row in rows:
        if row.kind not in (DIR, FILE, LINK) or not stat.S_IMODE(row.mode) == row.mode:
            raise errors.DataLoss(f"tree index {path} has an invalid row {row}")
    return from_rows(str(doc["digest"]), rows)
