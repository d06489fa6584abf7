"""Lazy eStargz layers: the TOC first, then each file's bytes by HTTP range on first read.

Where it sits: the FUSE image cache (``csi.fuse.images``) calls :func:`index_layers`
instead of streaming whole layers when every layer of an image carries the
eStargz TOC annotation (written by ``rukpak bundle build --estargz``, format in
``provisioner.bundle.estargz``). It fetches each layer's 51-byte footer and
its TOC member (one range request for the layer's last :data:`TAIL_BYTES`, a second
when the TOC member begins before them; a member above :data:`MAX_TOC_BYTES`, or one
inflating past :data:`MAX_TOC_JSON_BYTES`, is FailedPrecondition before it is
parsed), checks the TOC against the annotated digest, and applies the TOC's
entries to the tree index under bind mode's rules (``csi.fuse.index.Builder``) —
so NodePublishVolume can answer before any file content moved. Where each file's
gzip members lie is saved beside the index (``lazy/<tree>.json``).

The filesystem (``csi.fuse.fs``) calls :meth:`LazyFetcher.fetch` when a file
is opened and its content is not in the file store: one range request for the
file's members, inflated, checked against the TOC's digest and size as it
enters the store (DataLoss otherwise: the reader gets EIO). After indexing,
:meth:`LazyFetcher.complete` streams every layer in full in the background,
verifying the layer digest, and stores the files not fetched yet: only files
the TOC lists, with every member counted against the unpack budgets (``Limits``).
A failure is never kept as content: the next read or publish asks the registry
again.
"""

from __future__ import annotations

import calendar
import contextlib
import functools
import io
import logging
import struct
import tarfile
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from csi.fuse import index, unpack
from csi.fuse.filestore import FileStore
from rukpak.common import errors, jsonfast
from rukpak.common.fsio import write_bytes_atomic
from rukpak.image import layerio, layerstream, members, seams
from rukpak.image.seams import Puller
from rukpak.oci import digest as digests
from rukpak.oci import transport
from rukpak.oci.manifest import Descriptor, Manifest
from rukpak.oci.reference import Reference

log = logging.getLogger(__name__)

TOC_NAME = "stargz.index.json"
TOC_DIGEST_ANNOTATION = "containerd.io/snapshot/stargz/toc.digest"
LANDMARKS = frozenset({".prefetch.landmark", ".no.prefetch.landmark"})
_NOT_CONTENT = LANDMARKS | {TOC_NAME}  # entries a TOC lists that are no file of the image
FOOTER_SIZE = 51
TAIL_BYTES = 1 << 20
"""A layer's last bytes asked for first: the footer and, for TOCs up to about this
size compressed (~15,000 files), the TOC member too, in one request."""
MAX_TOC_BYTES = 16 << 20
"""Largest compressed TOC member read from a layer (its size is known from the footer,
so a larger one is refused before it is fetched)."""
MAX_TOC_JSON_BYTES = 16 << 20
"""Largest TOC document inflated and parsed (about 60,000 entries): parsing JSON costs
about ten times its size in memory, so a larger TOC is refused while it inflates,
before ``json`` sees it."""
_KINDS = {
    "reg": index.FILE,
    "dir": index.DIR,
    "symlink": index.LINK,
    "hardlink": "hardlink",
    "char": "device nodes and fifos are not extracted",
    "block": "device nodes and fifos are not extracted",
    "fifo": "device nodes and fifos are not extracted",
}


def is_lazy(manifest: Manifest) -> bool:
    """Whether every layer carries a TOC (else the image is fetched in full)."""
    return bool(manifest.layers) and all(
        TOC_DIGEST_ANNOTATION in (d.annotations or {}) for d in manifest.layers
    )


def fetch_range(puller: Puller, ref: Reference, digest: str, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of blob ``digest`` with one HTTP range request."""
    client_transport = getattr(puller, "transport", None)
    if client_transport is None:
        raise errors.FailedPrecondition("lazy fetching needs the registry client")
    target = transport.blob_target(ref, digest)
    response = client_transport.request(
        "GET",
        target,
        f"/v2/{ref.repository}/blobs/{digest}",
        headers={"Range": f"bytes={start}-{end - 1}"},
    )
    client_transport.check(response, target, ok=(200, 206))
    with response:
        data = response.content
    if response.status_code == 200:  # the registry ignored the range
        data = data[start:end]
    if len(data) != end - start:
        raise errors.DataLoss(
            f"blob {digest}: asked for bytes {start}-{end - 1}, got {len(data)} bytes"
        )
    return bytes(data)


def parse_footer(footer: bytes) -> int:
    """The TOC member's offset from an eStargz footer; InvalidArgument if it is not one."""
    if len(footer) != FOOTER_SIZE or footer[:4] != b"\x1f\x8b\x08\x04":
        raise errors.InvalidArgument("not an eStargz footer (no gzip header with Extra)")
    (xlen,) = struct.unpack_from("<H", footer, 10)
    extra = footer[12 : 12 + xlen]
    if extra[:2] != b"SG" or extra[4:][16:] != b"STARGZ":
        raise errors.InvalidArgument("not an eStargz footer (no SG subfield)")
    return int(extra[4:20], 16)


def read_toc(puller: Puller, ref: Reference, desc: Descriptor) -> tuple[list[dict[str, Any]], int]:
    """The TOC entries of layer ``desc`` and its TOC offset, checked against the annotation."""
    if desc.size < FOOTER_SIZE:
        raise errors.InvalidArgument(f"layer {desc.digest} is too small to be eStargz")
    tail_start = max(0, desc.size - TAIL_BYTES)
    tail = fetch_range(puller, ref, desc.digest, tail_start, desc.size)
    toc_offset = parse_footer(tail[-FOOTER_SIZE:])
    if not 0 <= toc_offset < desc.size - FOOTER_SIZE:
        raise errors.InvalidArgument(f"layer {desc.digest}: TOC offset out of range")
    compressed = desc.size - FOOTER_SIZE - toc_offset
    if compressed > MAX_TOC_BYTES:
        raise too_large_toc(desc, f"{compressed} bytes compressed", MAX_TOC_BYTES)
    if toc_offset >= tail_start:  # the TOC member came with the footer
        member = tail[toc_offset - tail_start : len(tail) - FOOTER_SIZE]
    else:
        member = fetch_range(puller, ref, desc.digest, toc_offset, desc.size - FOOTER_SIZE)
    toc = _toc_document(desc, member)
    expected = desc.annotations[TOC_DIGEST_ANNOTATION]
    actual = digests.Digester.for_digest(digests.check(expected, what="TOC digest"))
    actual.update(toc)
    if actual.digest() != expected:
        raise errors.DataLoss(
            f"layer {desc.digest}: its TOC hashes to {actual.digest()}, the manifest says "
            f"{expected}; re-push the image"
        )
    try:
        doc = jsonfast.loads(toc)
    except (ValueError, RecursionError) as exc:
        raise errors.InvalidArgument(
            f"layer {desc.digest}: its TOC is not a JSON document ({type(exc).__name__}); "
            "rebuild the image"
        ) from None
    entries = doc.get("entries") if isinstance(doc, dict) else None
    if not isinstance(entries, list):
        raise errors.InvalidArgument(f"layer {desc.digest}: TOC has no entries list")
    return entries, toc_offset


def too_large_toc(desc: Descriptor, size: str, cap: int) -> errors.FailedPrecondition:
    return errors.FailedPrecondition(
        f"layer {desc.digest}: its eStargz table of contents is {size}, more than the "
        f"{cap >> 20} MiB this plugin reads for lazy fetching; rebuild the image without "
        "--estargz, or with fewer files per layer"
    )


def _toc_document(desc: Descriptor, member: bytes) -> bytes:
    """The TOC's bytes from its gzip member (a tar holding one file), inflated within
    :data:`MAX_TOC_JSON_BYTES` plus room for tar headers; refused before it is parsed."""
    room = MAX_TOC_JSON_BYTES + 3 * tarfile.BLOCKSIZE
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        plain = inflater.decompress(member, room)
    except zlib.error as exc:
        raise errors.InvalidArgument(
            f"layer {desc.digest}: the TOC member is not gzip data ({exc})"
        ) from None
    if inflater.unconsumed_tail:
        raise too_large_toc(desc, f"more than {room} bytes inflated", MAX_TOC_JSON_BYTES)
    try:
        with tarfile.open(fileobj=io.BytesIO(plain), mode="r:") as tar:
            info = tar.next()
            if info is None or info.name != TOC_NAME or not info.isreg():
                raise errors.InvalidArgument(
                    f"layer {desc.digest}: no {TOC_NAME} at the TOC offset"
                )
            if info.size > MAX_TOC_JSON_BYTES:
                raise too_large_toc(desc, f"{info.size} bytes", MAX_TOC_JSON_BYTES)
            handle = tar.extractfile(info)
            assert handle is not None
            return handle.read()
    except tarfile.TarError as exc:
        raise errors.InvalidArgument(
            f"layer {desc.digest}: the TOC member is not a tar archive ({exc})"
        ) from None


def index_layers(
    builder: index.Builder, puller: Puller, ref: Reference, layers: Sequence[Descriptor]
) -> dict[str, list[int]]:
    """Apply every layer's TOC to ``builder``; returns file digest → [layer, start, end, size]."""
    spans: dict[str, list[int]] = {}
    for number, desc in enumerate(layers):
        entries, toc_offset = read_toc(puller, ref, desc)
        try:
            starts = sorted({int(e["offset"]) for e in entries if e.get("offset")})
        except (AttributeError, ValueError, TypeError) as exc:
            raise errors.InvalidArgument(
                f"layer {desc.digest}: TOC entries are malformed ({exc!r})"
            ) from None
        # Each member ends where the next begins; the last one where the TOC does.
        following = dict(zip(starts, [*starts[1:], toc_offset], strict=False))
        builder.begin_layer()
        last_file: list[int] | None = None  # the span chunks that follow extend
        for entry in entries:
            kind = entry.get("type", "")
            if kind == "chunk":
                if last_file is not None and entry.get("offset"):
                    last_file[2] = following[int(entry["offset"])]
                continue
            name = str(entry.get("name", ""))
            if name.strip("/") in _NOT_CONTENT:
                continue
            try:
                size = int(entry.get("size", 0)) if kind == "reg" else 0
                builder.charge(size)
                mode = int(entry.get("mode", 0o644))
                what = _KINDS.get(kind) or f"unsupported TOC entry type {kind!r}"
                parts = builder.prepare(name, mode=mode, kind=what)
                if parts is None:
                    continue
                mtime = _mtime(str(entry.get("modtime", "")))
                if kind == "reg":
                    digest = _file_digest(entry.get("digest", ""), name)
                    builder.add_file(parts, mode=mode, size=size, digest=digest, mtime=mtime)
                    last_file = None
                    if size and digest not in spans:
                        start = int(entry["offset"])
                        last_file = spans[digest] = [number, start, following[start], size]
                elif kind == "dir":
                    builder.add_dir(parts, mtime=mtime)
                elif kind == "symlink":
                    builder.add_symlink(parts, str(entry.get("linkName", "")), mtime=mtime)
                else:
                    builder.add_hardlink(parts, str(entry.get("linkName", "")))
            except index.Refused as refused:
                builder.stats.warn(f"layer {desc.digest}: {name!r}: {refused}")
            except (KeyError, ValueError, TypeError, AttributeError) as exc:
                raise errors.InvalidArgument(
                    f"layer {desc.digest}: TOC entry {name!r} is malformed ({exc!r})"
                ) from exc
    return spans


class LazyFetcher:
    """Delivers files of lazily indexed trees into the file store (``fs.Fetcher``).

    A failure is never remembered as content: a fetch that fails stores nothing and
    the next read asks the registry again; a completion that fails marks the tree in
    :attr:`broken` (for the log and the image cache, which starts it again on the
    next publish) and leaves every file it could not verify out of the store.
    """

    def __init__(
        self,
        files: FileStore,
        lazy_dir: Path,
        puller: Callable[[str], Puller],
        *,
        limits: members.Limits | None = None,
    ) -> None:
        self.files = files
        self.lazy_dir = lazy_dir
        self.lazy_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._puller = puller  # tree name → a puller with the credentials it was published with
        self.limits = limits or members.Limits()
        self._plans: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._running: set[str] = set()
        self.broken: set[str] = set()  # trees whose last completion failed

    def plan_path(self, tree: str) -> Path:
        return self.lazy_dir / f"{tree}.json"

    def save(
        self,
        tree: str,
        ref: Reference,
        layers: Sequence[Descriptor],
        spans: Any,
        *,
        durable: bool = True,
    ) -> None:
        plan = {
            "image": str(ref),
            "layers": [d.to_json() for d in layers],
            "files": spans,
        }
        # Compact, unsorted: 10,000 spans are encoded on the publish path.
        write_bytes_atomic(self.plan_path(tree), jsonfast.dumps(plan), durable=durable)
        with self._lock:
            self._plans[tree] = plan

    def _plan(self, tree: str) -> dict[str, Any]:
        with self._lock:
            plan = self._plans.get(tree)
            if plan is None:
                plan = jsonfast.loads((self.lazy_dir / f"{tree}.json").read_bytes())
                self._plans[tree] = plan
            return plan

    def fetch(self, tree: str, row: index.Row) -> None:
        """Store ``row``'s content, checked against its TOC digest and size as it enters."""
        if row.size == 0:  # no bytes in any layer: the TOC's digest of nothing
            with self.files.ingest(expect=row.digest, size=0):
                pass
            return
        plan = self._plan(tree)
        span = plan["files"].get(row.digest)
        if span is None:
            raise errors.NotFound(f"file {row.digest} is not in the lazy plan of tree {tree}")
        number, start, end, size = span
        layer = plan["layers"][number]
        ref = Reference.parse(plan["image"])
        data = fetch_range(self._puller(tree), ref, layer["digest"], start, end)
        with self.files.ingest(expect=row.digest, size=size) as sink:
            sink.write(_inflate_prefix(data, size))

    def complete(self, tree: str) -> None:
        """Stream every layer in full (digest-checked) and store the files still missing.

        Only files the TOC lists are stored; every member counts against the unpack
        budgets (bytes, files, depth), as in bind mode. One completion per tree at a
        time; on failure the tree is marked :attr:`broken` until one succeeds.
        """
        with self._lock:
            if tree in self._running:
                return
            self._running.add(tree)
        try:
            failure = self._complete(tree)
        finally:
            with self._lock:
                self._running.discard(tree)
        with self._lock:
            if failure is None:
                self.broken.discard(tree)
            else:
                self.broken.add(tree)
        if failure is not None:
            log.error("msg=%r tree=%s error=%r", "completing a lazy tree failed", tree, failure)

    def _complete(self, tree: str) -> str | None:
        plan = self._plan(tree)
        ref = Reference.parse(plan["image"])
        puller = self._puller(tree)
        listed: dict[str, int] = {digest: span[3] for digest, span in plan["files"].items()}
        sizes = set(listed.values())
        wanted = {d for d in listed if not self.files.has(d)}
        stats = members.ExtractStats()
        image = str(ref)
        try:
            for layer in plan["layers"]:
                desc = Descriptor(layer["mediaType"], layer["digest"], layer["size"])
                source = _stream(puller, ref, desc)
                with layerio.open_tar_stream(
                    layerio.Layer(Path(desc.digest), desc.media_type, desc.digest, source),
                    limit=self.limits.stream_bytes,
                    image=image,
                ) as tar:
                    for member in tar:
                        stats.charge(member.size if member.isreg() else 0, self.limits, image)
                        with contextlib.suppress(members.Refused):
                            members.check_entry(
                                member.name, limits=self.limits, image=image, stats=stats
                            )
                        if not member.isreg() or member.size not in sizes:
                            continue  # not a file the TOC lists: never stored
                        with self.files.ingest(durable=False, accept=listed.__contains__) as sink:
                            unpack._copy_data(tar, member, sink)
                        wanted.discard(sink.digest)
        except errors.RukpakError as exc:
            return exc.message
        except Exception as exc:  # an unreadable layer: the tree stays as fetched so far
            return repr(exc)
        self.files.sync()
        if wanted:
            return f"the layers lack {len(wanted)} files the TOC lists"
        log.info("msg=%r tree=%s image=%s", "lazy tree complete, layers verified", tree, ref)
        return None


def _file_digest(value: object, name: str) -> str:
    """A regular file's TOC digest, checked; the message naming the entry is built only
    for a digest that fails (10,000 entries are checked on the publish path)."""
    text = value if isinstance(value, str) else str(value)
    try:
        return digests.check(text)
    except errors.InvalidArgument:
        return digests.check(text, what=f"TOC entry {name}")  # raises, naming the entry


@functools.lru_cache(maxsize=256)  # a layer's entries mostly share one modtime
def _mtime(text: str) -> int:
    try:
        return calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")) if text else 0
    except ValueError:
        return 0


def _inflate_prefix(data: bytes, size: int) -> bytes:
    """The first ``size`` bytes of gzip members ``data`` (what follows is tar padding)."""
    out = bytearray()
    rest = data
    while len(out) < size and rest:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        out += inflater.decompress(rest, size - len(out))
        if not inflater.eof:
            break
        rest = inflater.unused_data
    if len(out) < size:
        raise errors.DataLoss(f"file members inflate to {len(out)} bytes, the TOC says {size}")
    return bytes(out[:size])


def _stream(puller: Puller, ref: Reference, desc: Descriptor) -> layerio.Source:
    streaming = seams.streaming(puller)
    if streaming is None:
        raise errors.FailedPrecondition("completing a lazy tree needs a streaming client")
    return layerstream.streamed(streaming, ref, desc)
