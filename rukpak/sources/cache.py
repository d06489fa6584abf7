"""The node's trees of git and http sources, kept beside the image trees.

Where it sits: the publish core (``csi.node.publish``) asks :class:`SourceCache` for
the tree of a pinned ``FetchSource`` (``rukpak.sources.volume``); below it are the
fetchers (``rukpak.sources.git``, ``rukpak.sources.http``) and the image extractor
(``rukpak.image.extract``), so a repository or tarball meets exactly the rules and
budgets of an image layer. Trees live in the image cache's ``unpacked/`` directory
under a key digest, committed by the node's one recipe (``rukpak.store.commit.Trees``,
the image cache's: staging ``.tmp-`` dir removed at start, directories sealed, rename,
``.sealed`` marker last, ``syncfs`` in the background, distrusted after a reboot until
then) and recorded through its public calls (``ImageCache.record_tree``,
``ImageCache.take``: the holder goes to the node's holder registry,
``rukpak.store.holders``), so holders, eviction and the start-up reconcile treat them
like image trees.

The key is the sha256 of (kind, location, pin, directory, credential fingerprint):
content fetched with a credential is only ever served to a volume presenting the
same credential (``rukpak.sources.auth.fingerprint``); a request without it fetches
on its own, and the server refuses it. Concurrent requests for one key fetch once.
A ``deadline`` (one per NodePublishVolume) goes down to the fetcher, which derives
its timeouts from it.
"""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path

from rukpak.common.backoff import Deadline
from rukpak.image import extract, tree
from rukpak.image.cache import ImageCache, Unpacked
from rukpak.image.cachestate import Holder
from rukpak.image.layerio import GZIP_MAGIC, ZSTD_MAGIC
from rukpak.image.locks import KeyedLocks
from rukpak.image.members import Limits
from rukpak.sources import auth as sourceauth
from rukpak.sources import git, http
from rukpak.sources.volume import FetchSource
from rukpak.store import ensure as keeping

log = logging.getLogger(__name__)

TAR = "application/vnd.oci.image.layer.v1.tar"
TAR_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
TAR_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"


def key_digest(source: FetchSource) -> str:
    """The tree's key: one per content and credential."""
    material = "\0".join(
        (
            source.kind,
            source.location,
            source.pin,
            source.directory,
            sourceauth.fingerprint(source.auth),
        )
    )
    return "sha256:" + hashlib.sha256(material.encode()).hexdigest()


class SourceCache:
    """Fetches, extracts and shares git and http trees in ``images``' tree store."""

    def __init__(
        self,
        images: ImageCache,
        *,
        limits: Limits | None = None,
        read_timeout: float = git.READ_TIMEOUT,
    ) -> None:
        self.images = images
        self.limits = limits or images.limits  # the plugin's --max-unpacked-* budgets
        self.read_timeout = read_timeout
        self._locks = KeyedLocks()

    def ensure(
        self,
        source: FetchSource,
        *,
        holder: Holder | None = None,
        deadline: Deadline | None = None,
    ) -> Unpacked:
        """The tree of ``source``, fetched unless present; held by ``holder``. Idempotent.

        The fetch answers DeadlineExceeded, naming the server, once ``deadline`` has passed.
        """
        digest = key_digest(source)

        def fetch() -> keeping.Found:
            self._fetch(source, digest, deadline)
            return keeping.Found(digest, hit=False)

        def take(found: keeping.Found) -> Unpacked:
            self.images.take(digest, holder, what=source.label())
            return Unpacked(digest=digest, path=self.images.tree_path(digest), cache_hit=found.hit)

        return keeping.ensure(  # the node's one ensure (rukpak.store.ensure)
            self._locks.hold(digest),
            committed=lambda: digest if self.images.has_tree(digest) else None,
            fetch=fetch,
            take=take,
        )

    def _fetch(self, source: FetchSource, digest: str, deadline: Deadline | None) -> None:
        started = time.monotonic()
        trees = self.images.trees  # the node's one commit recipe (rukpak.store.commit)
        work = trees.scratch(digest, "fetch-")
        work.mkdir(mode=0o700)
        try:
            archive, media_type, warnings = self._archive(source, work, deadline)
            with trees.stage(digest) as staging:
                stats = extract.extract_layers(
                    staging,
                    [extract.Layer(archive, media_type, "")],
                    image=source.label(),
                    limits=self.limits,
                )
                for warning in [*warnings, *stats.warnings]:
                    log.warning(
                        "msg=%r source=%s detail=%r", "entry refused", source.label(), warning
                    )
                trees.commit(staging, digest, files=stats.entries, bytes=stats.bytes)
        finally:
            _remove(work)
        self.images.record_tree(
            digest,
            {
                "digest": digest,
                "image": source.label(),
                "blobs": [],
                "size": stats.bytes,
                "private": source.auth is not None,
            },
        )
        log.info(
            "msg=%r source=%s digest=%s seconds=%.3f files=%d bytes=%d",
            "source unpacked",
            source.label(),
            digest,
            time.monotonic() - started,
            stats.entries,
            stats.bytes,
        )

    def _archive(
        self, source: FetchSource, work: Path, deadline: Deadline | None
    ) -> tuple[Path, str, list[str]]:
        """Fetch ``source`` into a tar archive in ``work``: (path, media type, warnings)."""
        archive = work / "content.tar"
        if source.kind == "git":
            repo = git.fetch_commit(
                source.location,
                source.pin,
                work / "repo",
                auth=source.auth,
                insecure=source.insecure,
                read_timeout=self.read_timeout,
                deadline=deadline,
            )
            try:
                directory = git.check_directory(source.directory, source.location)
                warnings = git.write_tar(
                    repo,
                    source.pin,
                    directory,
                    archive,
                    repository=source.location,
                    max_bytes=self.limits.max_bytes,
                    max_entries=self.limits.max_entries,
                )
            finally:
                repo.close()
            return archive, TAR, warnings
        http.fetch(
            source.location,
            archive,
            auth=source.auth,
            insecure=source.insecure,
            expect=source.pin,
            read_timeout=self.read_timeout,
            deadline=http.DEADLINE if deadline is None else deadline,
        )
        with open(archive, "rb") as f:
            head = f.read(4)
        if head.startswith(GZIP_MAGIC):
            return archive, TAR_GZIP, []
        if head.startswith(ZSTD_MAGIC):
            return archive, TAR_ZSTD, []
        return archive, TAR, []


def _remove(path: Path) -> None:
    try:
        tree.remove(path)
    except OSError as exc:
        log.error("msg=%r path=%s error=%r", "cannot remove", path, str(exc)[:300])
