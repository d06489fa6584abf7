"""eStargz layers: a tar stream → per-file gzip members, a table of contents and a footer.

Where it sits: ``rukpak bundle build --estargz`` (``provisioner.bundle.build``)
writes the bundle's tar through :func:`convert` instead of one gzip stream. The
result follows the published eStargz format of
``github.com/containerd/stargz-snapshotter/estargz`` (checked by reading our
layers with that reference implementation, see ``tests/estargz``):

* every regular file's data starts a new gzip member (files over 4 MiB are cut
  into chunks, one member each); tar headers and padding ride in the member
  before or after; the concatenation is one valid tar.gz, so any tool reads it;
* the last member holds the tar entry ``stargz.index.json``: the TOC, JSON with
  one entry per tar entry (``name``, ``type``, ``size``, ``mode``,
  ``linkName``, ``offset`` of the member where a file's data starts,
  ``digest`` of the whole file, and ``chunkOffset``/``chunkSize``/
  ``chunkDigest`` per chunk), then the tar end marker;
* a 51-byte footer: an empty gzip member whose Extra field (subfield ``SG``)
  holds ``%016xSTARGZ`` with the TOC member's offset.

The layer descriptor carries the TOC's digest in the annotation
``containerd.io/snapshot/stargz/toc.digest`` and the uncompressed size in
``io.containers.estargz.uncompressed-size``; a reader (the CSI plugin's lazy
fetcher) can fetch the footer, then the TOC, then single files by range.
Deterministic like the plain layer: no times or names in gzip headers.
"""

from __future__ import annotations

import hashlib
import json
import struct
import tarfile
import time
import zlib
from dataclasses import dataclass
from typing import IO, Any

TOC_NAME = "stargz.index.json"
TOC_DIGEST_ANNOTATION = "containerd.io/snapshot/stargz/toc.digest"
UNCOMPRESSED_SIZE_ANNOTATION = "io.containers.estargz.uncompressed-size"
FOOTER_SIZE = 51
CHUNK_SIZE = 4 << 20
BLOCK = tarfile.BLOCKSIZE
_TYPES = {
    tarfile.REGTYPE: "reg",
    tarfile.AREGTYPE: "reg",
    tarfile.DIRTYPE: "dir",
    tarfile.SYMTYPE: "symlink",
    tarfile.LNKTYPE: "hardlink",
    tarfile.CHRTYPE: "char",
    tarfile.BLKTYPE: "block",
    tarfile.FIFOTYPE: "fifo",
}


@dataclass(frozen=True)
class Result:
    """What :func:`convert` wrote: the uncompressed tar's digest (diff_id), the TOC's
    digest, the uncompressed size, and the compressed size."""

    diff_id: str
    toc_digest: str
    uncompressed_size: int
    size: int

    def annotations(self) -> dict[str, str]:
        return {
            TOC_DIGEST_ANNOTATION: self.toc_digest,
            UNCOMPRESSED_SIZE_ANNOTATION: str(self.uncompressed_size),
        }


class _Members:
    """Writes gzip members to ``sink``; counts compressed bytes and hashes the plain ones."""

    def __init__(self, sink: IO[bytes], level: int) -> None:
        self.sink = sink
        self.level = level
        self.offset = 0
        self.plain = hashlib.sha256()
        self.plain_size = 0
        self._gz: Any = None

    def open(self) -> None:
        if self._gz is None:
            self._gz = zlib.compressobj(self.level, zlib.DEFLATED, 31)  # gzip, mtime 0

    def write(self, data: bytes) -> None:
        self.open()
        self.plain.update(data)
        self.plain_size += len(data)
        self._emit(self._gz.compress(data))

    def close(self) -> None:
        if self._gz is not None:
            self._emit(self._gz.flush())
            self._gz = None

    def raw(self, data: bytes) -> None:
        self._emit(data)

    def _emit(self, data: bytes) -> None:
        if data:
            self.sink.write(data)
            self.offset += len(data)


def footer(toc_offset: int) -> bytes:
    """The 51-byte eStargz footer pointing at the TOC member (as the Go writer makes it)."""
    subfield = b"%016xSTARGZ" % toc_offset
    extra = b"SG" + struct.pack("<H", len(subfield)) + subfield
    header = b"\x1f\x8b\x08\x04" + b"\0\0\0\0" + b"\x00\xff" + struct.pack("<H", len(extra))
    empty_stored_block = b"\x01\x00\x00\xff\xff"
    out = header + extra + empty_stored_block + struct.pack("<II", 0, 0)
    assert len(out) == FOOTER_SIZE
    return out


def convert(source: IO[bytes], sink: IO[bytes], *, level: int = 6) -> Result:
    """Rewrite the uncompressed tar ``source`` as an eStargz blob into ``sink``."""
    out = _Members(sink, level)
    entries: list[dict[str, Any]] = []
    with tarfile.open(fileobj=source, mode="r|") as tar:
        for member in tar:
            if member.name == TOC_NAME:
                continue  # reserved, as the reference writer does
            entry = _entry(member)
            out.write(member.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape"))
            if member.isreg() and member.size > 0:
                data = tar.extractfile(member)
                assert data is not None
                whole = hashlib.sha256()
                written = 0
                while written < member.size:
                    out.close()  # a file's data, chunk by chunk, starts a new member
                    size = min(CHUNK_SIZE, member.size - written)
                    chunk = data.read(size)
                    if len(chunk) != size:
                        raise tarfile.ReadError(f"{member.name}: unexpected end of data")
                    if written:
                        entry = {"name": member.name, "type": "chunk"}
                    entry["offset"] = out.offset
                    if written:
                        entry["chunkOffset"] = written
                    if member.size - written >= CHUNK_SIZE:  # the last chunk: "to the end"
                        entry["chunkSize"] = size
                    entry["chunkDigest"] = "sha256:" + hashlib.sha256(chunk).hexdigest()
                    whole.update(chunk)
                    out.write(chunk)
                    entries.append(entry)
                    written += size
                first = next(e for e in reversed(entries) if e.get("type") == "reg")
                first["digest"] = "sha256:" + whole.hexdigest()
                if member.size % BLOCK:
                    out.write(b"\0" * (BLOCK - member.size % BLOCK))
            else:
                if member.isreg():
                    entry["digest"] = "sha256:" + hashlib.sha256(b"").hexdigest()
                entries.append(entry)
    out.close()
    toc_offset = out.offset
    toc = json.dumps({"version": 1, "entries": entries}, indent="\t").encode()
    info = tarfile.TarInfo(TOC_NAME)
    info.size = len(toc)
    info.mode = 0o644
    out.write(info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape"))
    out.write(toc + b"\0" * (-len(toc) % BLOCK))
    out.write(b"\0" * (2 * BLOCK))  # the tar end marker
    out.close()
    out.raw(footer(toc_offset))
    return Result(
        diff_id="sha256:" + out.plain.hexdigest(),
        toc_digest="sha256:" + hashlib.sha256(toc).hexdigest(),
        uncompressed_size=out.plain_size,
        size=out.offset,
    )


def _entry(member: tarfile.TarInfo) -> dict[str, Any]:
    kind = _TYPES.get(member.type)
    if kind is None:
        raise tarfile.ReadError(f"{member.name}: unsupported tar entry type {member.type!r}")
    entry: dict[str, Any] = {"name": member.name, "type": kind}
    if kind == "reg" and member.size:
        entry["size"] = member.size
    if member.mtime:
        entry["modtime"] = _rfc3339(int(member.mtime))
    if kind in ("symlink", "hardlink"):
        entry["linkName"] = member.linkname
    if member.mode:
        entry["mode"] = member.mode
    if member.uid:
        entry["uid"] = member.uid
    if member.gid:
        entry["gid"] = member.gid
    if member.uname:
        entry["userName"] = member.uname
    if member.gname:
        entry["groupName"] = member.gname
    if kind in ("char", "block"):
        entry["devMajor"] = member.devmajor
        entry["devMinor"] = member.devminor
    return entry


def _rfc3339(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))
