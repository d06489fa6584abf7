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

The rows are flat, in depth-first, name-sorted order (row 0 is the root); a row's
position is its stable local inode number, which the filesystem needs to answer the
kernel after a restart. They are saved as git saves trees: each directory's listing
(its entries, in that order) is one object of the file store, content-addressed, so
versions of a bundle that differ in one file share every other directory's listing
(one 4 KiB block each on disk, once); the tree's document (``trees/<hex>.json``) names
its directories' listings in depth-first order, from which the rows are rebuilt in the
same order. The first format (``version`` 1: the rows inline in the document) is what
a lazy tree is saved as on the publish path (one file), until its completion saves it
again with listings.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from csi.fuse.filestore import FileStore, matches
from rukpak.common import errors, jsonfast
from rukpak.common.fsio import fsync_files, write_bytes_atomic
from rukpak.image import extract, members
from rukpak.oci import digest as digests

DIR = "d"
FILE = "f"
LINK = "l"
FORMAT_VERSION = 2
INLINE_VERSION = 1  # the rows inline in the document: read, no longer written

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
    # The directory the last lookup ended in, by its parts: a layer's entries come
    # grouped by directory, so most lookups are this one. Every removal looks up the
    # removed entry's parent first (so what is remembered stays in the tree); it is
    # forgotten anyway whenever a directory leaves the tree.
    _last: tuple[tuple[str, ...], Node] | None = None

    def begin_layer(self) -> None:
        self._touched = set() if self._layers else None
        self._layers += 1

    def charge(self, size: int) -> None:
        """Count one entry (and its bytes) against the image's budgets."""
        self.stats.charge(size, self.limits, self.image)

    # --- the walk ---------------------------------------------------------------------

    def parent(self, parts: tuple[str, ...], *, create: bool) -> Node:
        """The directory holding ``parts[-1]``; refuses symlinked or non-directory parents."""
        where = parts[:-1]
        if self._last is not None and self._last[0] == where:
            return self._last[1]
        node = self.root
        for comp in where:
            assert node.children is not None
            child = node.children.get(comp)
            if child is None:
                if not create:
                    raise Refused(f"parent {comp!r} does not exist")
                child = node.children[comp] = _new_dir()
            elif child.kind != DIR:
                raise Refused(f"parent {comp!r} is a symlink or not a directory")
            node = child
        self._last = (where, node)
        return node

    def _put(self, parts: tuple[str, ...], node: Node) -> None:
        """Place a file or symlink at ``parts``, replacing what was there."""
        children = self.parent(parts, create=True).children
        assert children is not None
        old = children.get(parts[-1])
        if old is not None and old.kind == DIR:
            self._last = None
        children[parts[-1]] = node

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
        self._put(
            parts, Node(FILE, members.final_mode(mode), size=size, digest=digest, mtime=mtime)
        )

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
        self._put(parts, Node(LINK, 0o777, size=len(target.encode()), target=target, mtime=mtime))
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
        self._put(parts, Node(FILE, src.mode, size=src.size, digest=src.digest, mtime=src.mtime))

    def whiteout(self, parts: tuple[str, ...]) -> None:
        directory = self.parent(parts, create=True)
        self._last = None
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
    files: FileStore,
    extra: dict[str, Any] | None = None,
    durable: bool = True,
    inline: bool = False,
) -> Index:
    """Write the index of ``root`` (``save_rows``); returns it loaded."""
    rows = flatten(root)
    save_rows(path, digest, rows, files=files, extra=extra, durable=durable, inline=inline)
    return from_rows(digest, rows)


def save_rows(
    path: Path,
    digest: str,
    rows: list[Row],
    *,
    files: FileStore,
    extra: dict[str, Any] | None = None,
    durable: bool = True,
    inline: bool = False,
) -> None:
    """Store the listings of the directories of ``rows`` (``flatten``'s order) in
    ``files`` and write the tree's document atomically. With ``durable`` (the default)
    the store is synced before the document that names what it holds is written and
    fsynced; without, nothing is (the caller syncs both later, in that order). With
    ``inline``, the rows go in the document (the first format) and nothing in the
    store: one file, for a lazy tree on the publish path, where a listing's file
    each would cost more than the rest of the publish (its completion saves it
    again with listings)."""
    if inline:
        doc: dict[str, Any] = {"version": INLINE_VERSION, "digest": digest, "rows": rows}
    else:
        listings: dict[int, list[list[Any]]] = {i: [] for i, r in enumerate(rows) if r.kind == DIR}
        for row in rows[1:]:
            listings[row.parent].append(list(row[1:]))
        names = []
        for entries in listings.values():  # directories in row order: depth first
            body = jsonfast.dumps(entries)
            name = hashlib.sha256(body).hexdigest()
            if not files.has(f"sha256:{name}"):  # another version's, often
                with files.ingest(expect=f"sha256:{name}", durable=False) as sink:
                    sink.write(body)
            names.append(name)
        if durable:
            files.sync()
        doc = {
            "version": FORMAT_VERSION,
            "digest": digest,
            "root": [rows[0].mode, rows[0].mtime],
            "dirs": names,
        }
    doc.update(extra or {})
    write_bytes_atomic(path, jsonfast.dumps(doc), durable=durable)


def named_files(doc: Any, files: FileStore, read: set[str]) -> Iterator[str]:
    """The file digests a tree document names, for the collector: its directory listings
    and the files they list (a listing in ``read`` was read before: not again), or the
    first format's inline rows. A listing the store lacks or holds damaged names
    nothing (the tree cannot load; its files go unless another tree names them)."""
    if not isinstance(doc, dict):
        return
    for row in doc.get("rows") or ():  # the first format
        if isinstance(row, list) and len(row) > 5 and row[5]:
            yield str(row[5])
    dirs = doc.get("dirs")
    for name in dirs if isinstance(dirs, list) else ():
        if not isinstance(name, str) or name in read:
            continue
        read.add(name)
        try:
            entries = _listing(files, name)
        except (OSError, ValueError):
            continue
        yield f"sha256:{name}"
        for entry in entries:
            if entry[1] == FILE and entry[4]:
                yield str(entry[4])


def load(path: Path, files: FileStore) -> Index:
    """Read a saved index; DataLoss when it is not one this version wrote, or when the
    store lacks (or holds damaged) a listing it names."""
    return _loaded(path, _document(path), files)


def relist(path: Path, files: FileStore) -> None:
    """Save an index of the first format (a lazy tree's, written on the publish path)
    again with listings, durably: the same rows in the same order, so the inode numbers
    the filesystem gave stay. An index already saved with listings is only fsynced.
    DataLoss when it is unreadable (or gone)."""
    doc = _document(path)
    if doc.get("version") != INLINE_VERSION:
        fsync_files(path)
        return
    tree = _loaded(path, doc, files)
    extra = {k: v for k, v in doc.items() if k not in ("version", "digest", "rows")}
    save_rows(path, tree.digest, tree.rows, files=files, extra=extra)


def _document(path: Path) -> dict[str, Any]:
    try:
        doc = jsonfast.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError) as exc:
        raise _unreadable(path, exc) from exc
    if not isinstance(doc, dict):
        raise _unreadable(path, "not a JSON object")
    return doc


def _loaded(path: Path, doc: dict[str, Any], files: FileStore) -> Index:
    try:
        version = doc.get("version")
        if version == INLINE_VERSION:
            rows = [Row(*r) for r in doc["rows"]]
        elif version == FORMAT_VERSION:
            rows = _rebuild(doc, files)
        else:
            raise ValueError(f"format version {version!r}")
    except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        raise _unreadable(path, exc) from exc
    for row in rows:
        if row.kind not in (DIR, FILE, LINK) or not stat.S_IMODE(row.mode) == row.mode:
            raise errors.DataLoss(f"tree index {path} has an invalid row {row}")
    return from_rows(str(doc["digest"]), rows)


def _unreadable(path: Path, why: object) -> errors.DataLoss:
    return errors.DataLoss(f"tree index {path} is unreadable ({why}); delete it and publish again")


def _rebuild(doc: dict[str, Any], files: FileStore) -> list[Row]:
    """The rows of a document of listings, in the order ``flatten`` wrote them."""
    mode, mtime = doc["root"]
    rows = [Row(-1, "", DIR, int(mode), 0, "", "", int(mtime))]
    dirs = iter(doc["dirs"])

    def walk(parent: int) -> None:
        name = next(dirs, None)
        if not isinstance(name, str):
            raise ValueError("fewer directory listings than directories")
        for entry in _listing(files, name):
            rows.append(Row(parent, *entry))
            if rows[-1].kind == DIR:
                walk(len(rows) - 1)

    walk(0)
    if next(dirs, None) is not None:
        raise ValueError("more directory listings than directories")
    return rows


def _listing(files: FileStore, name: str) -> list[list[Any]]:
    digest = f"sha256:{name}"
    if not digests.is_valid(digest):
        raise ValueError(f"directory listing {name!r} is not a sha256 digest")
    fd = files.open_fd(digest)
    if fd is None:
        raise ValueError(f"the store lacks directory listing {digest}")
    with os.fdopen(fd, "rb") as handle:
        body = handle.read()
    if not matches(body, digest):
        raise ValueError(f"directory listing {digest} is damaged")
    entries = jsonfast.loads(body)
    if not isinstance(entries, list) or not all(
        isinstance(e, list) and len(e) == len(Row._fields) - 1 for e in entries
    ):
        raise ValueError(f"directory listing {digest} is not a list of entries")
    return entries
