"""The node's image cache: reference → one unpacked, read-only tree per manifest digest.

Where it sits: called by the publish core (``csi.node.publish``) for every
NodePublishVolume and by ``rukpak apply IMAGE`` (``provisioner.bundle.source``);
below it are the registry client (through the seams in ``rukpak.image.seams``), the
content store (``rukpak.image.store``), the streaming tee (``rukpak.image.layerstream``)
and the extractor (``rukpak.image.extract``). Its records live in
``rukpak.image.cachestate``. Layout under ``root``::

    content/                    the content store (ingest/, blobs/)
    unpacked/<manifest-hex>     finished trees, sealed read-only
    unpacked/<hex>.sealed       marker written once the tree is committed
    unpacked/<hex>.tmp-<rand>   trees being extracted or evicted (removed at start)
    state.json                  tag → digest, tree metadata, which trees an owner retains
    holders/                    which targets hold which tree (rukpak.store.holders; the
                                plugin passes the node's one registry, shared with FUSE mode)

A pull streams each missing layer into the store and the extractor at once; a
mismatch fails the pull, discarding both the ingest and the staging tree. Layers
already in the store unpack from there. A pull whose stream breaks is retried
once the old way: download every blob (with the client's retries), then unpack.

Commit: the node's one recipe (``rukpak.store.commit.Trees``, shared with the git and
http trees): the staging tree is sealed and renamed into ``unpacked/``, and
``unpacked/<hex>.sealed`` is written last. Durability follows in the background
(``rukpak.store.commit.Syncer``: ``syncfs``, then the marker says ``synced``), for the
tree and for the layer blobs streamed with it (committed without fsync); a tree
not synced before a reboot is distrusted and removed at start, and so are blobs
no remaining tree lists. At start also
``.tmp-`` dirs and trees without their marker are removed (a held one is adopted).

Retention: :meth:`ImageCache.retain` records the trees of an owner's kept images
(a BundleDeployment's revisions, named in the volume attributes ``retainFor`` and
``retain``); eviction spares them for ``retain_ttl`` seconds after the publish that
last named them, so a rollback finds them with the registry unreachable.

Private images: a tree pulled with credentials that anonymous access cannot read
is served to another pod only after its own credentials pass a manifest check
(``rukpak.image.grants``); public trees are served at once.

Holders: a publish records its target's holder in the node's holder registry
(``rukpak.store.holders``) under the state lock, the lock eviction picks its victims
under, so a tree is held before eviction can see it unheld; the holder's file is
written after the lock is released. A hot publish writes that one small file and
nothing else (the tree's last use stays in memory: ``rukpak.image.cachestate``).

Concurrency: one lock per (reference, platform) makes concurrent requests for
one image resolve and pull once; one lock per manifest digest covers two tags
naming the same content; the state lock guards the metadata. Order is always
reference → digest → state, so they cannot deadlock.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Collection, Iterable
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Unpack

from rukpak.common import errors
from rukpak.image import (
    artifact,
    eviction,
    extract,
    grants,
    layerstream,
    seams,
    tree,
)
from rukpak.image.cachestate import CacheState, Holder
from rukpak.image.leases import Leases
from rukpak.image.locks import KeyedLocks
from rukpak.image.seams import Puller, PullerFactory, PullPolicy, StreamingPuller
from rukpak.image.store import ContentStore, Fetch
from rukpak.image.storebase import ImageStoreBase, StoreOptions
from rukpak.oci import blobio
from rukpak.oci import digest as digests
from rukpak.oci.auth import Credentials
from rukpak.oci.manifest import Descriptor, Manifest, Platform
from rukpak.oci.reference import Reference
from rukpak.store import commit
from rukpak.store import ensure as keeping
from rukpak.store import holders as holding

__all__ = ["Holder", "ImageAsk", "ImageCache", "KeyedLocks", "PullPolicy", "Puller", "Unpacked"]

log = logging.getLogger(__name__)

SEALED = commit.SEALED
"""Suffix of a committed tree's marker, ``unpacked/<hex>.sealed``, written last."""


@dataclass(frozen=True)
class Unpacked:
    """A ready tree: ``path`` is read-only and stays until no target uses it."""

    digest: str
    path: Path
    cache_hit: bool


class ImageCache(ImageStoreBase):
    """Pulls, unpacks, shares and evicts image trees on one node."""

    def __init__(
        self,
        root: Path,
        *,
        durable: bool = True,
        holders: holding.Holders | None = None,
        **options: Unpack[StoreOptions],
    ) -> None:
        """``options``: what every image store takes (``rukpak.image.storebase``);
        ``holders``: the node's holder registry (default: its own under ``root``)."""
        super().__init__(root, **options)
        self.unpacked_dir = root / "unpacked"
        self.store = ContentStore(root / "content")
        self.unpacked_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.unpacked_dir, 0o711)  # bind-mount sources must be reachable
        self.budget_bytes = self.settings.budget_bytes
        self.durable = durable
        self._blob_locks = KeyedLocks()
        self.leases = Leases()
        self.state = CacheState(root / "state.json")
        self._state_lock = self.state.lock
        self.registry = holders or holding.Holders(root / "holders", durable=durable)
        # The one commit recipe (rukpak.store.commit), shared with the git and http trees.
        self.trees = commit.Trees(
            self.unpacked_dir, durable=durable, seal=tree.seal_dirs, remove=eviction.remove_tree
        )
        self.syncer = self.trees.syncer
        self._adopt_legacy_holders()
        self.evictor = eviction.Evictor(
            state=self.state,
            held=lambda: self.registry.held(store=holding.TREE),
            store=self.store,
            leases=self.leases,
            unpacked_dir=self.unpacked_dir,
            marker=self._marker,
            budget=lambda: self.budget_bytes,
            retain_ttl=self.settings.retain_ttl,
            clock=self._clock,
        )
        self._remove_unfinished_trees()

    @property
    def state_path(self) -> Path:
        return self.state.path

    def _remove_unfinished_trees(self) -> None:
        """Delete what a crash left behind, whatever it holds; never fails start
        (:meth:`rukpak.store.commit.Trees.recover`: staging trees, trees without their
        marker unless held, trees not synced before a reboot). Blobs no remaining tree
        lists go too.
        """
        self.trees.recover(
            held=self.registry.held(store=holding.TREE),
            forget=self.state.forget_tree,
            is_tree=lambda name: digests.is_valid(f"sha256:{name}"),
        )
        # Streamed blobs are committed without fsync and made durable with their tree:
        # a blob no kept tree lists may predate a power loss (or belong to a pull that
        # failed); it is only a cache, so it goes.
        in_use = self.state.blobs_in_use()
        for blob in list(self.store.blobs()):
            if blob.digest not in in_use:
                log.info("msg=%r digest=%s", "removing a blob no tree lists", blob.digest)
                self.store.delete(blob.digest)

    def tree_path(self, digest: str) -> Path:
        return self.unpacked_dir / digests.hex_of(digest)

    def has_tree(self, digest: str) -> bool:
        return self.tree_path(digest).is_dir()

    def _adopt_legacy_holders(self) -> None:
        """Move the holders a ``state.json`` of an older format names into the registry,
        then write the file without them (see ``rukpak.store.holders``)."""
        legacy = self.state.take_legacy_holders()
        if not legacy:
            return
        records = []
        for target, entry in legacy.items():
            if not isinstance(entry, dict):
                continue
            digest = entry.get("digest")
            records.append(
                holding.Record(
                    target=target,
                    volume_id=str(entry.get("volume_id", "")),
                    digest=digest if isinstance(digest, str) and digests.is_valid(digest) else "",
                    store=holding.TREE,
                    image=str(entry.get("image", "")),
                )
            )
        self.registry.adopt(records)
        self.state.save()

    def holders(self) -> dict[str, Holder]:
        """The targets holding trees of this cache (bind mode, git and http trees)."""
        return {
            t: Holder(t, r.volume_id, r.image)
            for t, r in self.registry.all(store=holding.TREE).items()
        }

    def holder(self, target: str) -> Holder | None:
        """Who holds a tree of this cache at ``target`` (one lookup, however many hold)."""
        record = self.registry.get(target, store=holding.TREE)
        return None if record is None else Holder(target, record.volume_id, record.image)

    def holder_digest(self, target: str) -> str | None:
        record = self.registry.get(target, store=holding.TREE)
        return record.digest if record is not None and digests.is_valid(record.digest) else None

    def hold(self, digest: str, holder: Holder) -> None:
        """Record that ``holder`` uses the tree of ``digest`` (protects it from eviction)."""
        self.registry.hold(self._record(digest, holder))

    def release(self, target: str) -> None:
        """Forget the holder at ``target`` (of this cache's trees); idempotent."""
        self.registry.release(target, store=holding.TREE)

    @staticmethod
    def _record(digest: str, holder: Holder) -> holding.Record:
        return holding.Record(
            target=holder.target,
            volume_id=holder.volume_id,
            digest=digest,
            store=holding.TREE,
            image=holder.image,
        )

    def take(self, digest: str, holder: Holder | None, *, what: str) -> None:
        """Mark the tree of ``digest`` used now and, with ``holder``, held by it, checking
        under the lock eviction works under that it is still there (Aborted naming
        ``what`` when it was evicted in between). Writes the holder's record only: a hot
        publish rewrites no shared state (``rukpak.store.holders``)."""
        record = None if holder is None else self._record(digest, holder)
        with self._state_lock:
            if not self.has_tree(digest):  # evicted between the lookup and now
                raise errors.Aborted(f"{what} was evicted while in use; retry")
            self.state.touch(digest)
            previous = None if record is None else self.registry.stage(record)
        if record is not None:
            try:
                self.registry.persist(record.target)
            except BaseException:
                self.registry.unstage(record, previous)
                raise

    def record_tree(self, digest: str, record: dict[str, object]) -> None:
        """Record a committed tree (its size, blobs, source, privacy), durably."""
        self.state.record_tree(digest, record)

    # --- retention (rukpak.image.cachestate) ---------------------------------------------

    @property
    def retain_ttl(self) -> float:
        """Seconds a retention counts after the publish that last set it."""
        return self.evictor.retain_ttl

    def retain(
        self,
        owner: str,
        refs: Iterable[str],
        platform: Platform,
        *,
        labels: Iterable[str] = (),
    ) -> list[str]:
        """Make the trees of ``refs`` on ``platform`` and of the git or http source
        ``labels`` the ones ``owner`` retains (spared by eviction for :attr:`retain_ttl`
        seconds from now), replacing what it retained.

        A reference maps to the tree its last pull on ``platform`` recorded or, when it is
        pinned by digest, to the tree of that manifest digest; a label to every source
        tree recorded under it (one per credential that fetched it). What the cache holds
        no tree for is skipped. Returns the references and labels retained. Idempotent.
        """
        with self._state_lock:  # eviction picks its victims under this lock
            kept: dict[str, list[str]] = {}
            for text in refs:
                digest = self._tree_of(Reference.parse(text), platform)
                if digest is not None:
                    kept.setdefault(text, [digest])
            for label in labels:
                found = self.state.trees_labelled(label)
                if found:
                    kept.setdefault(label, found)
            self.state.retain(owner, {d for ds in kept.values() for d in ds}, self._clock())
        return list(kept)

    def retained(self) -> set[str]:
        """Hex digests of the trees retained now (within the TTL)."""
        return self.state.retained(self._clock(), self.retain_ttl)

    def _tree_of(self, ref: Reference, platform: Platform) -> str | None:
        digest = self.state.tag(f"{ref}|{platform}")
        if digest is not None and self.has_tree(digest):
            return digest
        if ref.digest is not None and self.has_tree(ref.digest):
            return ref.digest  # the digest of a manifest names its tree
        return None

    # --- ensure -------------------------------------------------------------------

    def resolve_digest(
        self, image: str, *, platform: Platform, credentials: Credentials | None = None
    ) -> str:
        """Where ``image`` points now in its registry, for ``platform`` (asked each time,
        whatever is cached: a refresh volume follows a tag this way)."""
        ref = Reference.parse(image)
        digest, _ = self.grants.resolve(
            self._puller_factory(credentials), ref, platform, credentials
        )
        return digest

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
        cannot remove it in between (the node's one ``ensure``, ``rukpak.store.ensure``).
        """
        ask = ImageAsk(Reference.parse(image), platform, credentials, pull_policy)
        key = ask.key

        def fetch() -> keeping.Found:
            def guard(digest: str) -> AbstractContextManager[object]:
                stack = ExitStack()
                stack.enter_context(self._digest_locks.hold(digest))
                stack.enter_context(self.leases.lease([digest]))
                return stack

            found = ask.fetch(
                self.grants,
                self._puller_factory,
                guard=guard,
                has_tree=self.has_tree,
                pull=lambda puller, digest, manifest, private: self._pull(
                    puller, ask.ref, digest, manifest, private=private
                ),
            )
            self.state.set_tag(key, found.digest)
            return found

        return keeping.ensure(
            self._ref_locks.hold(key),
            committed=lambda: ask.committed(
                self.grants, self._cached_digest(key), private=self._is_private
            ),
            fetch=fetch,
            take=lambda found: self._done(found.digest, holder, hit=found.hit),
        )

    def _is_private(self, digest: str) -> bool:
        """Trees pulled with credentials that anonymous access could not read; a tree
        without a record (state lost) counts as private until a check proves otherwise."""
        record = self.state.tree(digest)
        return record is None or record.get("private", True) is not False

    def _cached_digest(self, key: str) -> str | None:
        digest = self.state.tag(key)
        return digest if digest is not None and self.has_tree(digest) else None

    def _done(self, digest: str, holder: Holder | None, *, hit: bool) -> Unpacked:
        self.take(digest, holder, what=f"image {digest}")
        self._observer.cache_result(hit=hit)
        if not hit:
            self._request_eviction()
        return Unpacked(digest=digest, path=self.tree_path(digest), cache_hit=hit)

    def _pull(
        self, puller: Puller, ref: Reference, digest: str, manifest: Manifest, *, private: bool
    ) -> None:
        started = time.monotonic()
        placements = artifact.placements(ref, manifest.layers)  # tar layers, titled files
        blobs = [manifest.config, *manifest.layers]
        with self.leases.lease(d.digest for d in blobs):  # eviction keeps its hands off
            distinct = {d.digest: d for d in blobs}.values()
            fetched = sum(d.size for d in distinct if not self.store.has(d.digest))
            self._put(puller, ref, manifest.config)
            streaming = seams.streaming(puller)
            try:
                stats = self._unpack(puller, ref, digest, placements, streaming=streaming)
            except errors.Unavailable as exc:
                if streaming is None:
                    raise
                log.warning(
                    "msg=%r image=%s error=%r",
                    "streaming pull failed; downloading the blobs first",
                    ref,
                    exc.message,
                )
                stats = self._unpack(puller, ref, digest, placements, streaming=None)
        self.state.record_tree(
            digest,
            {
                "digest": digest,
                "image": str(ref),
                "blobs": [d.digest for d in blobs],
                "size": stats.bytes,
                "private": private,
            },
        )
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
        placements: list[artifact.Placement],
        *,
        streaming: StreamingPuller | None,
    ) -> extract.ExtractStats:
        """Extract every layer into a staging dir, seal it and rename it into place (an
        artifact's file layer: its blob placed at its title, see ``rukpak.image.artifact``)."""
        layers = []
        for placement in placements:
            d, source = placement.layer, None
            if placement.is_file:  # the whole blob is the file: stored first, then linked
                self._put_streamed(puller, streaming, ref, d)
                layers.append(
                    extract.Layer(
                        self.store.path(d.digest), d.media_type, d.digest, None, placement.name
                    )
                )
                continue
            if streaming is not None:
                source = layerstream.layer_source(
                    self.store, streaming, ref, d, locks=self._blob_locks
                )
            else:
                self._put(puller, ref, d)
            layers.append(extract.Layer(self.store.path(d.digest), d.media_type, d.digest, source))
        with self.trees.stage(digest) as staging:
            stats = extract.extract_layers(staging, layers, image=str(ref), limits=self._limits)
            for warning in stats.warnings:
                log.warning("msg=%r image=%s detail=%r", "layer entry refused", ref, warning)
            # the extractor created the files read-only; the recipe seals the directories
            self.trees.commit(staging, digest, files=stats.entries, bytes=stats.bytes)
        return stats

    def _marker(self, digest: str) -> Path:
        return self.trees.marker(digest)

    def _put_streamed(
        self, puller: Puller, streaming: StreamingPuller | None, ref: Reference, desc: Descriptor
    ) -> None:
        """Download ``desc`` into the store unless present, streamed into the ingest file
        (made durable with its tree, as a streamed layer is) when the puller streams."""
        if streaming is None:
            self._put(puller, ref, desc)
            return
        with self._blob_locks.hold(desc.digest):
            if self.store.has(desc.digest):
                return
            # the stream verifies size and digest as it ends, before the ingest commits
            with (
                self.store.ingest(
                    desc.digest, desc.size, durable=False, source_verified=True
                ) as sink,
                streaming.open_blob(ref, desc) as stream,
            ):
                for piece in blobio.pieces(stream):
                    sink.write(piece)

    def _put(self, puller: Puller, ref: Reference, desc: Descriptor) -> None:
        """Download ``desc`` into the store unless present; one download per blob at a time
        (concurrent pulls of images sharing it wait, then find it present)."""
        with self._blob_locks.hold(desc.digest):
            self.store.put(desc.digest, desc.size, _fetcher(puller, ref, desc))

    # --- eviction (rukpak.image.eviction) -----------------------------------------------

    def usage(self) -> int:
        """Bytes held: blobs plus unpacked trees (as recorded)."""
        return self.evictor.usage()

    def _request_eviction(self) -> None:
        self.evictor.request()

    def evict(self, *, keep: Collection[str] = ()) -> list[str]:
        """Evict until under budget, now (:meth:`rukpak.image.eviction.Evictor.evict`)."""
        return self.evictor.evict(keep=keep)


@dataclass(frozen=True)
class ImageAsk:
    """One request for an image's tree, the steps of ``ensure`` every image store shares
    (this cache and the FUSE store, ``csi.fuse.images``): the same reuse policy and
    private-tree checks (``rukpak.image.grants``), the same resolve-then-pull-once."""

    ref: Reference
    platform: Platform
    credentials: Credentials | None
    policy: PullPolicy

    @property
    def key(self) -> str:
        """The lock and tag key: one per (reference, platform)."""
        return f"{self.ref}|{self.platform}"

    def committed(
        self, grants_: grants.Grants, cached: str | None, *, private: Callable[[str], bool]
    ) -> str | None:
        """The pull policy over a node's cache, the same for every cache that asks:
        ``cached`` (the digest the reference last resolved to, when the node still holds
        its tree) serves unless the policy is Always, once :meth:`grants.Grants.authorize`
        passes when ``private(cached)``; None means resolve and pull. Nothing cached
        under Never is FailedPrecondition (:func:`grants.not_present`)."""
        if cached is not None and self.policy is not PullPolicy.ALWAYS:
            if private(cached):
                grants_.authorize(
                    self.ref, cached, self.credentials, platform=self.platform, policy=self.policy
                )
            return cached
        if self.policy is PullPolicy.NEVER:
            raise grants.not_present(self.ref, self.platform)
        return None

    def fetch(
        self,
        grants_: grants.Grants,
        puller_factory: PullerFactory,
        *,
        guard: Callable[[str], AbstractContextManager[object]],
        has_tree: Callable[[str], bool],
        pull: Callable[[Puller, str, Manifest, bool], None],
    ) -> keeping.Found:
        """Resolve the reference, then, under ``guard(digest)`` (the digest's lock),
        ``pull(puller, digest, manifest, private)`` unless the store has the tree."""
        puller = puller_factory(self.credentials)
        try:
            digest, manifest = grants_.resolve(puller, self.ref, self.platform, self.credentials)
            with guard(digest):
                hit = has_tree(digest)
                if not hit:
                    private = grants_.pulled_privately(
                        self.ref, digest, self.platform, self.credentials
                    )
                    pull(puller, digest, manifest, private)
        finally:
            seams.close(puller)
        return keeping.Found(digest, hit)


def _fetcher(puller: Puller, ref: Reference, desc: Descriptor) -> Fetch:
    def fetch(dest: Path) -> None:
        puller.fetch_blob(ref, desc, dest)

    return fetch
