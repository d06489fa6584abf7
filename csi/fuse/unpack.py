"""Layers → tree index + file store: the FUSE mode's "extraction", with nothing extracted.

Where it sits: called by the FUSE image cache (``csi.fuse.images``) for each
layer of an image, in order. Tar members come from the same reader as bind
mode (``rukpak.image.layerio``: compression, decompression budget, a live
download or a stored blob); each regular file's bytes stream into the file
store (``csi.fuse.filestore``) and the entry goes into the in-memory index
(``csi.fuse.index.Builder``), which applies bind mode's rules. Refused entries
are skipped and reported, unreadable layers are InvalidArgument, and a full
disk is ResourceExhausted — as in ``rukpak.image.extract``.
"""

from __future__ import annotations

import shutil
import tarfile
from collections.abc import Sequence

from csi.fuse import index
from csi.fuse.filestore import FileIngest, FileStore
from rukpak.image import extract, layerio, members

CHUNK = 1 << 20


def build(
    store: FileStore,
    layers: Sequence[layerio.Layer],
    *,
    image: str,
    limits: extract.Limits | None = None,
) -> tuple[index.Node, extract.ExtractStats]:
    """Apply ``layers`` in order; returns the finished tree and what was done.

    Files are not fsynced one by one: call ``store.sync()`` before saving the index.
    """
    builder = index.Builder(image=image, limits=limits or extract.Limits())
    for layer in layers:
        apply_layer(builder, store, layer)
    return builder.finish(), builder.stats


def apply_layer(builder: index.Builder, store: FileStore, layer: layerio.Layer) -> None:
    builder.begin_layer()

    def apply(tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        _apply_member(builder, store, tar, member)

    members.apply_layer(
        layer,
        apply,
        image=builder.image,
        limits=builder.limits,
        stats=builder.stats,
        doing="storing",
    )


def _kind(member: tarfile.TarInfo) -> str:
    if member.isreg():
        return index.FILE
    if member.isdir():
        return index.DIR
    if member.issym():
        return index.LINK
    if member.islnk():
        return "hardlink"
    if member.ischr() or member.isblk() or member.isfifo():
        return "device nodes and fifos are not extracted"
    return f"unsupported tar entry type {member.type!r}"


def _apply_member(
    builder: index.Builder, store: FileStore, tar: tarfile.TarFile, member: tarfile.TarInfo
) -> None:
    builder.charge(member.size if member.isreg() else 0)
    parts = builder.prepare(member.name, mode=member.mode, kind=_kind(member))
    if parts is None:
        return
    mtime = max(0, int(member.mtime))
    if member.isreg():
        with store.ingest(durable=False) as sink:  # the caller syncs once at the end
            _copy_data(tar, member, sink)
        builder.add_file(parts, mode=member.mode, size=sink.size, digest=sink.digest, mtime=mtime)
    elif member.isdir():
        builder.add_dir(parts, mtime=mtime)
    elif member.issym():
        builder.add_symlink(parts, member.linkname, mtime=mtime)
    else:
        builder.add_hardlink(parts, member.linkname)


def _copy_data(tar: tarfile.TarFile, member: tarfile.TarInfo, sink: FileIngest) -> None:
    """The member's bytes, straight from the tar stream (``next`` skips the padding)."""
    if member.sparse is not None:  # rare: let tarfile expand the holes
        src = tar.extractfile(member)
        if src is not None:
            shutil.copyfileobj(src, sink, CHUNK)  # type: ignore[misc]
        return
    stream = tar.fileobj
    assert stream is not None
    left = member.size
    while left:
        chunk = stream.read(min(left, CHUNK))
        if not chunk:
            raise tarfile.ReadError("unexpected end of data")
        left -= len(chunk)
        sink.write(chunk)
