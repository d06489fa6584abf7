"""The FUSE mode's image cache: reference → a saved tree index per manifest digest.

Where it sits: called by the FUSE publisher (``csi.fuse.publisher``); below it
the registry client (through ``rukpak.image.cache``'s ``Puller`` seam), the layer
walker (``csi.fuse.unpack``) and the file store. Layout under ``root``::

    files/sha256/<hex>   file contents (csi.fuse.filestore)
    trees/<hex>.json     one index per image manifest (csi.fuse.index)
    lazy/<hex>.json      a lazy tree's plan: its layers, each file's byte span (csi.fuse.lazy)
    tags/<h>.json        reference|platform → manifest digest, one file a tag (csi.fuse.tags)
    retained.json        owner → the trees its kept revisions name (rukpak.image.retention)
    boot_id              the boot of the last start (after a reboot, torn lazy indexes go)

Private trees are served from the cache only to pods whose own credentials the
registry accepts now: bind mode's rule (``rukpak.image.grants``, re-checked after
``--private-image-auth-ttl``), the same call as ``rukpak.image.cache``.

A lazy tree fetches its files with the credentials it was published with.
They stay in memory, plus a copy handed to the /dev/fuse holder (``keeper``,
memory only too), from which a restarted plugin takes them back
(:meth:`FuseImages.restore_credentials`): secrets never reach the disk or a log.

Retention: as in bind mode, a publish whose volume names an owner (``retainFor``,
``retain``) records the trees of that owner's kept revisions (:meth:`FuseImages.retain`);
the collection spares them for ``retain_ttl`` seconds after the publish that last named
them (:meth:`FuseImages.retained`), so a rollback finds them with the registry
unreachable.

Layers are streamed from the registry straight into the walker — the layer
blobs are not kept, only the files they hold, so ten versions of a bundle that
differ in one file cost one version plus one file. The registry client
verifies each layer's digest when its stream ends; an index is saved (the
commit point, atomically) only after every layer verified. Concurrent
requests for one image pull it once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Unpack

from csi.fuse import index, lazy, tags, unpack
from csi.fuse.collect import Collector
from csi.fuse.filestore import FileStore
from rukpak.common import background, errors
from rukpak.common.fsio import (
    fsync_files,
    read_json_or_set_aside,
    write_bytes_atomic,
    write_json_atomic,
)
from rukpak.image import layerio, layerstream, retention, seams
from rukpak.image.cache import ImageAsk
from rukpak.image.grants import Grants
from rukpak.image.seams import PullPolicy
from rukpak.image.storebase import ImageStoreBase, StoreOptions
from rukpak.oci import digest as digests
from rukpak.oci.auth import Credentials
from rukpak.oci.manifest import Manifest, Platform
from rukpak.oci.reference import Reference
from rukpak.store import commit
from rukpak.store import ensure as keeping

log = logging.getLogger(__name__)


class CredentialKeeper(Protocol):
    """Keeps lazy trees' credentials across plugin restarts (``csi.fuse.session.HolderClient``)."""

    def keep_credentials(self, tree: str, blob: bytes) -> None: ...


def dump_credentials(credentials: Credentials) -> bytes:
    """``credentials`` as a dockerconfigjson document (for the keeper; never logged)."""
    auths: dict[str, dict[str, str]] = {}
    for host in credentials.hosts():
        c = credentials.for_host(host)
        if c is not None:
            auths[host] = {
                "username": c.username,
                "password": c.password,
                "identitytoken": c.identity_token,
                "registrytoken": c.registry_token,
            }
    return json.dumps({"auths": auths}).encode()


@dataclass(frozen=True)
class Ready:
    """A tree whose index is saved: ``name`` is its directory name in the FUSE mount."""

    digest: str
    name: str
    cache_hit: bool


class FuseImages(ImageStoreBase):
    """Pulls images into the file store and saves their tree indexes."""

    def __init__(
        self, root: Path, *, shared_grants: Grants | None = None, **options: Unpack[StoreOptions]
    ) -> None:
        """``options``: what every image store takes (``rukpak.image.storebase``);
        ``shared_grants``: bind mode's credential re-check table, to share it."""
        super().__init__(root, grants=shared_grants, **options)
        self.files = FileStore(root)
        self.trees_dir = root / "trees"
        self.trees_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.tags = tags.Tags(root / "tags", legacy=root / "tags.json")
        self._lock = threading.Lock()  # retention and the lazy trees still to complete
        self.retain_ttl = self.settings.retain_ttl
        self.retained_path = root / "retained.json"
        kept = read_json_or_set_aside(self.retained_path)
        self._retained: retention.Table = dict(kept) if isinstance(kept, dict) else {}
        # Lazy trees fetch with the credentials they were published with (memory only).
        self._pullers: dict[str, seams.Puller] = {}
        self._restored: dict[str, Credentials] = {}  # from the keeper, after a restart
        self._incomplete: set[str] = set()  # lazy trees whose background fetch waits
        self.keeper: CredentialKeeper | None = None
        self.lazy = lazy.LazyFetcher(
            self.files, root / "lazy", self._puller_for, limits=self._limits
        )
        self.on_forget: list[Callable[[str], None]] = []  # more to drop with an evicted tree
        self.on_indexed: list[Callable[[str, index.Index], None]] = []  # a tree is ready
        self.collector = Collector(
            self.files,
            self.trees_dir,
            budget_bytes=self.settings.budget_bytes,
            forget=self._forget_tree,
            retained=self.retained,
        )
        self._drop_torn_after_reboot()

    def index_path(self, name: str) -> Path:
        return self.trees_dir / f"{name}.json"

    def has_tree(self, digest: str) -> bool:
        return self.index_path(digests.hex_of(digest)).is_file()

    def ensure(
        self,
        image: str,
        *,
        platform: Platform,
        pull_policy: PullPolicy,
        credentials: Credentials | None = None,
    ) -> Ready:
        """The saved index of ``image`` for ``platform``, pulling as the policy says. Idempotent."""
        ask = ImageAsk(Reference.parse(image), platform, credentials, pull_policy)
        key = ask.key

        def committed() -> str | None:
            tagged = self.tags.get(key)
            cached = tagged if tagged and self.has_tree(tagged) else None
            # as bind mode: the same policy, the same checks
            return ask.committed(self.grants, cached, private=self._is_private)

        def pull(puller: seams.Puller, digest: str, manifest: Manifest, private: bool) -> None:
            with self.collector.pulling():
                self._pull(_Job(puller, ask.ref, digest, manifest, private, credentials))

        def fetch() -> keeping.Found:
            found = ask.fetch(
                self.grants,
                self._puller_factory,
                guard=self._digest_locks.hold,
                has_tree=self.has_tree,
                pull=pull,
            )
            self.tags.set(key, found.digest)  # its one small file (csi.fuse.tags)
            return found

        def take(found: keeping.Found) -> Ready:
            name = digests.hex_of(found.digest)
            self.collector.touch(name)
            if found.hit and name in self.lazy.broken:  # its last completion failed: retry
                with self._lock:
                    self._incomplete.add(name)
            self._observer.cache_result(hit=found.hit)
            return Ready(found.digest, name, cache_hit=found.hit)

        return keeping.ensure(  # the node's one ensure (rukpak.store.ensure)
            self._ref_locks.hold(key), committed=committed, fetch=fetch, take=take
        )

    def retain(self, owner: str, refs: Iterable[str], platform: Platform) -> list[str]:
        """Make the trees of ``refs`` (image references pinned by digest) on ``platform``
        the ones ``owner`` retains, as of now, replacing what it retained: the tree its
        last publish on ``platform`` resolved, or the tree of the manifest digest it
        names. What the store holds no tree for is skipped. Returns the references
        retained. Idempotent."""
        kept: dict[str, str] = {}
        for text in refs:
            ref = Reference.parse(text)
            tagged = self.tags.get(f"{ref}|{platform}")
            for digest in (tagged, ref.digest):
                if digest and self.has_tree(digest):
                    kept.setdefault(text, digest)
                    break
        with self._lock:
            change = retention.set_owner(self._retained, owner, kept.values(), self._clock())
            retention.expire(self._retained, self._clock(), self.retain_ttl)
            if change is not retention.Change.NONE:
                write_json_atomic(
                    self.retained_path,
                    self._retained,
                    durable=change is retention.Change.DIGESTS,
                )
        return list(kept)

    def retained(self) -> set[str]:
        """Tree names (hex digests) retained now (within ``retain_ttl``)."""
        with self._lock:
            return retention.fresh(self._retained, self._clock(), self.retain_ttl)

    def _is_private(self, digest: str) -> bool:
        """Trees pulled with credentials anonymous access could not read (or unknown)."""
        try:
            doc = json.loads(self.index_path(digests.hex_of(digest)).read_bytes())
        except (OSError, ValueError):
            return True
        return doc.get("private", True) is not False

    def _pull(self, job: _Job) -> None:
        started = time.monotonic()
        ref, m = job.ref, job.manifest
        layerio.require_tar_layers(ref, m.layers)
        if lazy.is_lazy(m) and getattr(job.puller, "transport", None) is not None:
            self._index_lazily(job)
            return
        streaming = seams.streaming(job.puller)
        if streaming is None:
            raise errors.FailedPrecondition("FUSE mode needs a registry client that can stream")
        layers = [
            layerio.Layer(
                Path(d.digest), d.media_type, d.digest, layerstream.streamed(streaming, ref, d)
            )
            for d in m.layers
        ]
        root, stats = unpack.build(self.files, layers, image=str(ref), limits=self._limits)
        # durable: the files and listings synced before the index that names them
        self._save_index(job, root, stats.warnings)
        seconds = time.monotonic() - started
        self._observer.pulled(seconds=seconds, nbytes=sum(d.size for d in m.layers))
        log.info(
            "msg=%r image=%s digest=%s seconds=%.3f files=%d bytes=%d",
            "image indexed",
            ref,
            job.digest,
            seconds,
            stats.entries,
            stats.bytes,
        )

    def _index_lazily(self, job: _Job) -> None:
        """eStargz: index from the TOCs now; files on first read; layers in the background."""
        started = time.monotonic()
        builder = index.Builder(image=str(job.ref), limits=self._limits)
        spans = lazy.index_layers(builder, job.puller, job.ref, job.manifest.layers)
        root = builder.finish()
        name = digests.hex_of(job.digest)
        self._pullers[name] = self._puller_factory(job.credentials)
        self._keep(name, job.credentials)
        # Written, not fsynced: a restarted plugin reads them from the page cache, and the
        # background thread makes them durable first thing (a power loss ends the mount;
        # after a reboot, torn ones are dropped: _drop_torn_after_reboot).
        self.lazy.save(name, job.ref, job.manifest.layers, spans, durable=False)
        self._save_index(job, root, builder.stats.warnings, durable=False, inline=True, lazy=True)
        with self._lock:
            self._incomplete.add(name)  # completed once published (complete_in_background)
        seconds = time.monotonic() - started
        self._observer.pulled(seconds=seconds, nbytes=0)  # its files come on first read
        log.info(
            "msg=%r image=%s digest=%s seconds=%.3f files=%d",
            "image indexed from its TOC (files fetched on first read)",
            job.ref,
            job.digest,
            seconds,
            builder.stats.entries,
        )

    def _save_index(
        self,
        job: _Job,
        root: index.Node,
        warnings: Iterable[str],
        *,
        durable: bool = True,
        inline: bool = False,
        **extra: object,
    ) -> None:
        """Log the entries the rules refused, then write the index: the tree is ready."""
        for warning in warnings:
            log.warning("msg=%r image=%s detail=%r", "layer entry refused", job.ref, warning)
        extra = {"image": str(job.ref), "private": job.private, **extra}
        name = digests.hex_of(job.digest)
        saved = index.save(
            self.index_path(name),
            job.digest,
            root,
            files=self.files,
            extra=extra,
            durable=durable,
            inline=inline,
        )
        for callback in self.on_indexed:
            callback(name, saved)

    def complete_in_background(self, name: str) -> None:
        """Start fetching the rest of lazy tree ``name`` (once; no-op for other trees).

        The publisher calls this after the volume is mounted: the fetch competes for
        the interpreter, so it starts after NodePublishVolume's own work is done.
        """
        with self._lock:
            if name not in self._incomplete:
                return
            self._incomplete.discard(name)
        self._start_completion(name)

    def _start_completion(self, name: str) -> None:
        threading.Thread(
            target=self._complete, args=(name,), name=f"complete-{name[:12]}", daemon=True
        ).start()

    def _complete(self, name: str) -> None:
        """Make the lazy tree's index (saved again with listings) and plan durable, then
        fetch its missing files."""
        background.let_starter_finish()  # the publish that started it answers first
        try:
            self._relist(name)
            fsync_files(self.lazy.plan_path(name))
        except (FileNotFoundError, errors.DataLoss):
            return  # evicted meanwhile (or unreadable: the next publish pulls it again)
        except OSError as exc:
            log.error("msg=%r tree=%s error=%r", "cannot sync a lazy tree's index", name, exc)
        self.lazy.complete(name)

    def _relist(self, name: str) -> None:
        """Save the lazy tree's index again with directory listings (``index.relist``),
        safe from the collector's deletions as a pull is (its listings are named by no
        document until the new one is written); not evicted meanwhile, as it was just
        published (held, and used recently)."""
        with self.collector.pulling():
            index.relist(self.index_path(name), self.files)

    def _drop_torn_after_reboot(self) -> None:
        """After a reboot, drop lazy indexes and plans a power loss may have torn.

        They are written without fsync on the publish path (and synced right after);
        one the kernel did not write back before the node went down reads as empty or
        broken JSON. Such a tree is pulled again when next published.
        """
        marker = self.root / "boot_id"
        now = commit.boot_id()
        try:
            before = marker.read_text().strip()
        except OSError:
            before = ""
        if before and before != now:
            for path in sorted(self.trees_dir.glob("*.json")):
                plan = self.lazy.plan_path(path.stem)
                doc = _json_or_none(path)
                torn = (
                    doc is None
                    or (doc.get("lazy") is True and _json_or_none(plan) is None)
                    or not self._loads(path)
                )
                if torn:
                    log.warning("msg=%r tree=%s", "dropping a tree index torn by a reboot", path)
                    path.unlink(missing_ok=True)
                    plan.unlink(missing_ok=True)
            for plan in sorted(self.lazy.lazy_dir.glob("*.json")):
                if not self.index_path(plan.stem).exists():
                    plan.unlink(missing_ok=True)
        if before != now:
            write_bytes_atomic(marker, now.encode())

    def resume_lazy(self) -> int:
        """Restart the background completion of lazy trees a previous process left unfinished."""
        started = 0
        for plan in sorted(self.lazy.lazy_dir.glob("*.json")):
            try:
                files = json.loads(plan.read_bytes()).get("files", {})
            except (OSError, ValueError):
                continue
            if all(self.files.has(d) for d in files):
                continue
            self._start_completion(plan.stem)
            started += 1
        return started

    def _forget_tree(self, tree: str) -> None:
        """Drop what refers to an evicted tree (its index is already gone)."""
        self.tags.forget_tree(tree)
        (self.lazy.lazy_dir / f"{tree}.json").unlink(missing_ok=True)
        puller = self._pullers.pop(tree, None)
        if puller is not None:
            seams.close(puller)
        self._restored.pop(tree, None)
        drop = getattr(self.keeper, "drop_credentials", None)
        if drop is not None:
            with contextlib.suppress(OSError, ValueError, errors.RukpakError):
                drop(tree)
        for callback in self.on_forget:
            callback(tree)

    def _keep(self, tree: str, credentials: Credentials | None) -> None:
        if not credentials or self.keeper is None:
            return
        try:
            self.keeper.keep_credentials(tree, dump_credentials(credentials))
        except (OSError, ValueError, errors.RukpakError) as exc:
            log.warning(
                "msg=%r tree=%s error=%r",
                "the FUSE holder did not take this tree's credentials; after a plugin restart "
                "its files not fetched yet are fetched anonymously",
                tree,
                type(exc).__name__,
            )

    def restore_credentials(self, kept: dict[str, bytes]) -> int:
        """Take back the credentials of lazy trees published before a restart."""
        for tree, blob in kept.items():
            try:
                self._restored[tree] = Credentials.from_dockerconfigjson(blob)
            except errors.RukpakError:
                log.warning("msg=%r tree=%s", "kept credentials are not readable", tree)
        return len(self._restored)

    def _puller_for(self, tree: str) -> seams.Puller:
        puller = self._pullers.get(tree)
        if puller is None:  # after a restart: the credentials the holder kept, or none
            puller = self._pullers[tree] = self._puller_factory(self._restored.get(tree))
        return puller

    def load(self, name: str) -> index.Index:
        return index.load(self.index_path(name), self.files)

    def _loads(self, path: Path) -> bool:
        """Whether the index at ``path`` loads (its listings present and intact)."""
        try:
            index.load(path, self.files)
        except errors.DataLoss:
            return False
        return True

    def tree_names(self) -> list[str]:
        return sorted(p.stem for p in self.trees_dir.glob("*.json"))


@dataclass(frozen=True)
class _Job:
    """One image to index: the client fetching it, what it is, who asked."""

    puller: seams.Puller
    ref: Reference
    digest: str
    manifest: Manifest
    private: bool
    """Pulled with credentials anonymous access could not use (recorded in the index)."""
    credentials: Credentials | None


def _json_or_none(path: Path) -> dict[str, object] | None:
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None
