"""The node's image cache: reference → one unpacked, read-only tree per manifest digest.

Where it sits: called by the publish core (``csi.node.publish``) for every
NodePublishVolume; below it are the registry client (through the ``Puller``
seam), the content store (``csi.image.store``) and the extractor
(``csi.image.extract``). Layout under ``root``::

    content/                    the content store (ingest/, blobs/)
    unpacked/<manifest-hex>     finished trees, sealed read-only
    unpacked/<hex>.tmp-<rand>   trees being extracted (removed at start)
    state.json                  tag → digest, tree metadata, which targets use which tree

A pull streams each missing layer: the registry's verifying stream is teed
into the content store's ingest file and into the extractor, so download,
hashing, decompression and file creation overlap (as in ``curl | tar -xz``).
The layer's blob is committed when its stream ends with the right size and
digest (checked by the client and again by the store); a mismatch fails the
pull, discarding both the ingest and the staging tree. Layers already in the
store unpack from there. A pull whose stream breaks is retried once the old
way: download every blob (with the client's retries), then unpack.

The rename of a finished tree into ``unpacked/`` is the commit point: a crash
before it leaves only a ``.tmp-`` dir (removed at start), after it a complete
tree. ``state.json`` is rewritten atomically and is advisory for trees (a tree
on disk without metadata is still used).

Concurrency: one lock per (reference, platform) makes concurrent requests for
one image resolve and pull once; one lock per manifest digest covers two tags
naming the same content; a state lock guards the metadata. Order is always
reference → digest → state, so they cannot deadlock.
"""

from __future__ import annotations

import contextlib
import enum
import io
import json
import logging
import os
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Protocol, cast

from csi.common import errors
from csi.common.fsio import fsync_dir, write_json_atomic
from csi.image import extract, tree
from csi.image.store import ContentStore, Ingest
from csi.oci import digest as digests
from csi.oci import mediatypes
from csi.oci.auth import Credentials
from csi.oci.manifest import Descriptor, Manifest, Platform
from csi.oci.reference import Reference

log = logging.getLogger(__name__)

LAYER_TYPES = frozenset(
    {
        mediatypes.OCI_LAYER_TAR,
        mediatypes.OCI_LAYER_GZIP,
        mediatypes.OCI_LAYER_ZSTD,
        mediatypes.OCI_LAYER_NONDIST_TAR,
        mediatypes.OCI_LAYER_NONDIST_GZIP,
        mediatypes.OCI_LAYER_NONDIST_ZSTD,
        mediatypes.DOCKER_LAYER_GZIP,
        mediatypes.DOCKER_LAYER_FOREIGN_GZIP,
    }
)


class PullPolicy(enum.Enum):
    IF_NOT_PRESENT = "IfNotPresent"
    ALWAYS = "Always"
    NEVER = "Never"

    @classmethod
    def parse(cls, text: str) -> PullPolicy:
        for policy in cls:
            if policy.value == text:
                return policy
        raise errors.InvalidArgument(
            f"pullPolicy {text!r} is invalid: use IfNotPresent, Always or Never"
        )


class Puller(Protocol):
    """What the cache needs from a registry client (``csi.oci.client.RegistryClient``)."""

    def resolve_image(
        self, ref: Reference, platform: Platform | None = None
    ) -> tuple[Descriptor, Manifest]: ...

    def fetch_blob(self, ref: Reference, desc: Descriptor, dest: Path) -> None: ...


class StreamingPuller(Puller, Protocol):
    """A puller that can also stream a blob, verifying it as it is read."""

    def open_blob(
        self, ref: Reference, desc: Descriptor
    ) -> contextlib.AbstractContextManager[BinaryIO]: ...


PullerFactory = Callable[[Credentials | None], Puller]


class Observer(Protocol):
    """Metrics hook; ``csi.plugin.metrics`` implements it."""

    def cache_result(self, *, hit: bool) -> None: ...

    def pulled(self, *, seconds: float, nbytes: int) -> None: ...


class _NoObserver:
    def cache_result(self, *, hit: bool) -> None:
        pass

    def pulled(self, *, seconds: float, nbytes: int) -> None:
        pass


@dataclass(frozen=True)
class Unpacked:
    """A ready tree: ``path`` is read-only and stays until no target uses it."""

    digest: str
    path: Path
    cache_hit: bool


@dataclass(frozen=True)
class Holder:
    """Who uses a tree: one published target path and its volume."""

    target: str
    volume_id: str
    image: str


class KeyedLocks:
    """A lock per key, created on first use."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}

    @contextlib.contextmanager
    def hold(self, key: str) -> Iterator[None]:
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            yield


class ImageCache:
    """Pulls, unpacks, shares and evicts image trees on one node."""

    def __init__(
        self,
        root: Path,
        *,
        puller_factory: PullerFactory,
        limits: extract.Limits | None = None,
        budget_bytes: int = 10 * 1024**3,
        observer: Observer | None = None,
    ) -> None:
        self.root = root
        self.unpacked_dir = root / "unpacked"
        self.state_path = root / "state.json"
        self.store = ContentStore(root / "content")
        self.unpacked_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.unpacked_dir, 0o711)  # bind-mount sources must be reachable
        self._puller_factory = puller_factory
        self._limits = limits or extract.Limits()
        self.budget_bytes = budget_bytes
        self._observer: Observer = observer or _NoObserver()
        self._ref_locks = KeyedLocks()
        self._digest_locks = KeyedLocks()
        self._state_lock = threading.RLock()
        self._state = self._load_state()
        self._remove_unfinished_trees()

    # --- state ------------------------------------------------------------------

    def _load_state(self) -> dict[str, Any]:
        empty: dict[str, Any] = {"tags": {}, "trees": {}, "holders": {}}
        try:
            data = json.loads(self.state_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return empty
        except (OSError, ValueError) as exc:
            log.warning(
                "msg=%r path=%s error=%r",
                "state file unreadable; starting empty",
                self.state_path,
                str(exc),
            )
            return empty
        for key in empty:
            if not isinstance(data.get(key), dict):
                data[key] = {}
        return dict(data)

    def _save(self) -> None:
        write_json_atomic(self.state_path, self._state)

    def _remove_unfinished_trees(self) -> None:
        for entry in self.unpacked_dir.iterdir():
            if ".tmp-" in entry.name:
                _remove_tree(entry)

    def tree_path(self, digest: str) -> Path:
        return self.unpacked_dir / digests.hex_of(digest)

    def has_tree(self, digest: str) -> bool:
        return self.tree_path(digest).is_dir()

    def holders(self) -> dict[str, Holder]:
        with self._state_lock:
            return {
                target: Holder(target, h["volume_id"], h["image"])
                for target, h in self._state["holders"].items()
            }

    def holder_digest(self, target: str) -> str | None:
        with self._state_lock:
            entry = self._state["holders"].get(target)
            return None if entry is None else str(entry["digest"])

    def hold(self, digest: str, holder: Holder) -> None:
        """Record that ``holder`` uses the tree of ``digest`` (protects it from eviction)."""
        with self._state_lock:
            self._state["holders"][holder.target] = {
                "digest": digest,
                "volume_id": holder.volume_id,
                "image": holder.image,
            }
            self._touch(digest)
            self._save()

    def release(self, target: str) -> None:
        """Forget the holder at ``target``; idempotent."""
        with self._state_lock:
            if self._state["holders"].pop(target, None) is not None:
                self._save()

    def _touch(self, digest: str) -> None:
        tree = self._state["trees"].setdefault(digests.hex_of(digest), {})
        tree["last_used"] = time.time()

    # --- ensure -------------------------------------------------------------------

    def ensure(
        self,
        image: str,
        *,
        platform: Platform,
        pull_policy: PullPolicy,
        credentials: Credentials | None = None,
        holder: Holder | None = None,
    ) -> Unpacked:
        """Return the unpacked tree of ``image`` for ``platform``, pulling as the policy says.

        Idempotent; concurrent calls for one image pull it once. With ``holder``,
        the tree is recorded as used by it before this returns, so eviction
        cannot remove it in between.
        """
        ref = Reference.parse(image)
        key = f"{ref}|{platform}"
        with self._ref_locks.hold(key):
            cached = self._cached_digest(key)
            if cached is not None and pull_policy is not PullPolicy.ALWAYS:
                return self._done(cached, holder, hit=True)
            if pull_policy is PullPolicy.NEVER:
                raise errors.FailedPrecondition(
                    f"image {ref} ({platform}) is not present on this node and pullPolicy is "
                    "Never; pre-pull it or use pullPolicy IfNotPresent"
                )
            puller = self._puller_factory(credentials)
            try:
                desc, manifest = puller.resolve_image(ref, platform)
                digest = digests.check(desc.digest, what=str(ref))
                with self._digest_locks.hold(digest):
                    hit = self.has_tree(digest)
                    if not hit:
                        self._pull(puller, ref, digest, manifest)
            finally:
                close = getattr(puller, "close", None)
                if callable(close):
                    close()
            with self._state_lock:
                self._state["tags"][key] = digest
            return self._done(digest, holder, hit=hit)

    def _cached_digest(self, key: str) -> str | None:
        with self._state_lock:
            digest = self._state["tags"].get(key)
        if isinstance(digest, str) and digests.is_valid(digest) and self.has_tree(digest):
            return digest
        return None

    def _done(self, digest: str, holder: Holder | None, *, hit: bool) -> Unpacked:
        with self._state_lock:
            if not self.has_tree(digest):  # evicted between the lookup and now
                raise errors.Aborted(f"image {digest} was evicted while in use; retry")
            self._touch(digest)
            if holder is not None:
                self.hold(digest, holder)
            else:
                self._save()
        self._observer.cache_result(hit=hit)
        if not hit:
            self.evict(keep={digest})
        return Unpacked(digest=digest, path=self.tree_path(digest), cache_hit=hit)

    def _pull(self, puller: Puller, ref: Reference, digest: str, manifest: Manifest) -> None:
        started = time.monotonic()
        for layer in manifest.layers:
            if layer.media_type not in LAYER_TYPES:
                raise errors.InvalidArgument(
                    f"image {ref}: layer {layer.digest} has media type {layer.media_type!r}, "
                    "which is not a filesystem layer; bundle images must use tar layers"
                )
        blobs = [manifest.config, *manifest.layers]
        distinct = {d.digest: d for d in blobs}.values()
        fetched = sum(d.size for d in distinct if not self.store.has(d.digest))
        config = manifest.config
        self.store.put(config.digest, config.size, _fetcher(puller, ref, config))
        streaming = _streaming(puller)
        try:
            stats = self._unpack(puller, ref, digest, manifest, streaming=streaming)
        except errors.Unavailable as exc:
            if streaming is None:
                raise
            log.warning(
                "msg=%r image=%s error=%r",
                "streaming pull failed; downloading the blobs first",
                ref,
                exc.message,
            )
            stats = self._unpack(puller, ref, digest, manifest, streaming=None)
        with self._state_lock:
            self._state["trees"][digests.hex_of(digest)] = {
                "digest": digest,
                "image": str(ref),
                "blobs": [d.digest for d in blobs],
                "size": stats.bytes,
                "last_used": time.time(),
            }
            self._save()
        seconds = time.monotonic() - started
        self._observer.pulled(seconds=seconds, nbytes=fetched)
        log.info(
            "msg=%r image=%s digest=%s seconds=%.3f fetched_bytes=%d files=%d bytes=%d",
            "image unpacked",
            ref,
            digest,
            seconds,
            fetched,
            stats.entries,
            stats.bytes,
        )

    def _unpack(
        self,
        puller: Puller,
        ref: Reference,
        digest: str,
        manifest: Manifest,
        *,
        streaming: StreamingPuller | None,
    ) -> extract.ExtractStats:
        """Extract every layer into a staging dir, seal it and rename it into place."""
        layers = []
        for d in manifest.layers:
            source = None
            if streaming is not None:
                source = self._layer_source(streaming, ref, d)
            else:
                self.store.put(d.digest, d.size, _fetcher(puller, ref, d))
            layers.append(extract.Layer(self.store.path(d.digest), d.media_type, d.digest, source))
        staging = self.unpacked_dir / f"{digests.hex_of(digest)}.tmp-{secrets.token_hex(4)}"
        staging.mkdir(mode=0o755)
        try:
            stats = extract.extract_layers(staging, layers, image=str(ref), limits=self._limits)
            for warning in stats.warnings:
                log.warning("msg=%r image=%s detail=%r", "layer entry refused", ref, warning)
            tree.seal_dirs(staging)  # the extractor created the files read-only
            os.replace(staging, self.tree_path(digest))
            fsync_dir(self.unpacked_dir)
        except BaseException:
            _remove_tree(staging)
            raise
        return stats

    def _layer_source(
        self, puller: StreamingPuller, ref: Reference, desc: Descriptor
    ) -> Callable[[], contextlib.AbstractContextManager[io.BufferedReader]]:
        @contextlib.contextmanager
        def open_layer() -> Iterator[io.BufferedReader]:
            if self.store.has(desc.digest):  # e.g. the same layer twice in one image
                with open(self.store.path(desc.digest), "rb") as f:
                    yield f
                return
            # Exits run inner first: the client verifies what it streamed, then the
            # store checks its own count and hash and commits the blob.
            with (
                self.store.ingest(desc.digest, desc.size) as sink,
                puller.open_blob(ref, desc) as stream,
            ):
                tee = _Tee(stream, sink)
                yield io.BufferedReader(tee, _Tee.CHUNK)
                tee.drain()

        return open_layer

    # --- eviction -----------------------------------------------------------------

    def usage(self) -> int:
        """Bytes held: blobs plus unpacked trees (as recorded)."""
        with self._state_lock:
            trees = sum(int(t.get("size", 0)) for t in self._state["trees"].values())
        return self.store.total_size() + trees

    def evict(self, *, keep: Collection[str] = ()) -> list[str]:
        """Remove least recently used trees no target holds until under budget.

        Returns the evicted manifest digests. Blobs no remaining tree lists go too.
        """
        evicted: list[str] = []
        with self._state_lock:
            if self.usage() <= self.budget_bytes:
                return evicted
            held = {digests.hex_of(h["digest"]) for h in self._state["holders"].values()}
            held |= {digests.hex_of(d) for d in keep}
            candidates = sorted(
                (hex_ for hex_ in self._state["trees"] if hex_ not in held),
                key=lambda h: float(self._state["trees"][h].get("last_used", 0)),
            )
            for hex_ in candidates:
                if self.usage() <= self.budget_bytes:
                    break
                tree = self._state["trees"].pop(hex_)
                _remove_tree(self.unpacked_dir / hex_)
                in_use = {b for t in self._state["trees"].values() for b in t.get("blobs", [])}
                for blob in tree.get("blobs", []):
                    if blob not in in_use and digests.is_valid(blob):
                        self.store.delete(blob)
                self._state["tags"] = {
                    k: v for k, v in self._state["tags"].items() if not str(v).endswith(hex_)
                }
                evicted.append(str(tree.get("digest", hex_)))
                log.info("msg=%r digest=%s", "evicted unused image", tree.get("digest", hex_))
            self._save()
        return evicted


class _Tee(io.RawIOBase):
    """Reads a blob stream and appends every byte read to the store's ingest file."""

    CHUNK = 1 << 20

    def __init__(self, stream: BinaryIO, sink: Ingest) -> None:
        super().__init__()
        self._stream = stream
        self._sink = sink

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        data = self._stream.read(len(buffer))
        n = len(data)
        memoryview(buffer).cast("B")[:n] = data
        self._sink.write(data)
        return n

    def drain(self) -> None:
        """Store what the extractor left unread (tar padding after the end marker)."""
        while data := self._stream.read(self.CHUNK):
            self._sink.write(data)


def _streaming(puller: Puller) -> StreamingPuller | None:
    """``puller`` when it can stream blobs (the registry client can; test doubles may not)."""
    return cast(StreamingPuller, puller) if callable(getattr(puller, "open_blob", None)) else None


def _fetcher(puller: Puller, ref: Reference, desc: Descriptor) -> Callable[[Path], None]:
    def fetch(dest: Path) -> None:
        puller.fetch_blob(ref, desc, dest)

    return fetch


def _remove_tree(path: Path) -> None:
    if path.is_symlink() or not path.exists():
        return
    tree.unseal(path)
    shutil.rmtree(path, ignore_errors=True)
