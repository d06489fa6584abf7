"""The FUSE publish path: volume → tree index → read-only bind of its directory in the mount.

Where it sits: the node's publish core (``csi.node.publish.Publisher``) hands
volumes whose ``publishMode`` is ``fuse`` to :meth:`FusePublisher.publish`,
under its per-target lock and after its target checks; unpublishing is the
same unmount for both modes, then :meth:`FusePublisher.release`. Below it: the
FUSE image cache (``csi.fuse.images``) and the mount (``csi.fuse.service``).

A tree whose every file is in the store is presented at kernel speed: a read-only
bind of a directory of hard links into the store (``csi.fuse.linked``; the record
says ``"presentation": "linked"``), or, where hard links into the store are
impossible (or ``FUSE_LINKED=false``), an overlayfs over a metadata tree and the
store's files (``csi.fuse.overlay``; ``"presentation": "overlay"``). A lazy tree with
files still to fetch is bound from the FUSE mount, so a volume is readable before its
files arrive; once fetched, new publishes of it get the kernel-speed presentation.

After each publish and unpublish the store's collection runs in the background
(``csi.fuse.collect``): trees no record holds and no owner retains
(``FuseImages.retained``) may go when over budget.

Idempotency matches bind mode: the same volume and image on the same target
again is success; anything else on a mounted target is AlreadyExists. Which
target holds which tree is recorded in the node's holder registry
(``rukpak.store.holders``, the one bind mode uses; records of ``store`` ``fuse``), one
small file per target, so a restart knows the trees in use and a publish writes
nothing else. A ``publishes.json`` of an older plugin is taken over at start.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Protocol

from csi import mounter as mounts
from csi.fuse import index, linked, overlay
from csi.fuse.images import FuseImages
from csi.volume.request import PublishRequest
from rukpak.common import errors
from rukpak.common.fsio import fsync_dir, read_json_or_set_aside
from rukpak.oci.manifest import Platform
from rukpak.store import holders as holding

log = logging.getLogger(__name__)

OVERLAY = "overlay"
LINKED = "linked"
KERNEL_SPEED = (OVERLAY, LINKED)


class Mount(Protocol):
    """What the publisher needs of the running filesystem (``csi.fuse.service``)."""

    def tree_dir(self, name: str) -> Path: ...

    def tree_index(self, name: str) -> index.Index | None: ...


class FusePublisher:
    """Publishes volumes from the FUSE mount; records who uses which tree."""

    def __init__(
        self,
        images: FuseImages,
        mount: Mount,
        records: Path,
        *,
        meta: overlay.MetaTrees | None = None,
        links: linked.LinkedTrees | None = None,
        holders: holding.Holders | None = None,
    ) -> None:
        """``records``: the ``publishes.json`` of older plugins, taken over at start;
        ``holders``: the node's holder registry (default: one beside ``records``);
        ``meta``: present fully fetched trees as overlays (None: always the FUSE view);
        ``links``: present them as linked trees first (None: overlays)."""
        self.images = images
        self.mount = mount
        self.meta = meta
        self.links = links
        self.records_path = records
        self.registry = holders or holding.Holders(records.parent / "holders")
        self._present_lock = threading.Lock()  # a tree's metadata is not dropped mid-publish
        self._adopt_legacy_records()

    def _adopt_legacy_records(self) -> None:
        """Move the records of a ``publishes.json`` (target → volume, image, tree and
        presentation) into the registry, then remove the file."""
        loaded = read_json_or_set_aside(self.records_path)
        if loaded is None:
            return
        records = []
        for target, known in (loaded if isinstance(loaded, dict) else {}).items():
            if isinstance(known, dict) and isinstance(known.get("tree"), str):
                records.append(_to_record(target, {k: str(v) for k, v in known.items()}))
        self.registry.adopt(records)
        self.records_path.unlink(missing_ok=True)
        fsync_dir(self.records_path.parent)

    def publish(
        self,
        req: PublishRequest,
        target: Path,
        *,
        platform: Platform,
        mounter: mounts.MounterProtocol,
    ) -> Path:
        """Bind the image's tree directory read-only on ``target`` (the request's target,
        checked); returns it. Idempotent."""
        key = str(target)
        volume_id, source = req.volume_id, req.source
        current = mounts.find_on(mounter, target)
        found = self.registry.get(key, store=holding.FUSE)
        known = None if found is None else _from_record(found)
        if known is not None and not known["volume_id"]:
            known = None  # adopted at start (volume unknown): this publish names it again
        if current is not None and known is not None:
            if known["volume_id"] == volume_id and known["image"] == source.image:
                log.info("msg=%r target=%s volume_id=%s", "already published", key, volume_id)
                return (
                    target
                    if known.get("presentation") in KERNEL_SPEED
                    else self.mount.tree_dir(known["tree"])
                )
            raise errors.AlreadyExists(
                f"target {key} already holds volume {known['volume_id']} with image "
                f"{known['image']}; unpublish it first"
            )
        ready = self.images.ensure(
            source.pinned or source.image,
            platform=source.platform or platform,
            pull_policy=source.pull_policy,
            credentials=req.credentials,
        )
        tree_dir = self.mount.tree_dir(ready.name)
        record = {"volume_id": volume_id, "image": source.image, "tree": ready.name}
        if current is not None:
            if current.root.rstrip("/") == "/" + ready.name:  # ours, its record was lost
                self._set(key, record)
                return tree_dir
            if self.meta is not None and self.meta.is_presenting(current, ready.name):
                self._set(key, {**record, "presentation": OVERLAY})
                return target
            if self.links is not None and self.links.is_presenting(current, ready.name):
                self._set(key, {**record, "presentation": LINKED})
                return target
            raise errors.AlreadyExists(
                f"target {key} is already a mount point of other content; unpublish it first"
            )
        if target.exists() and not target.is_dir():
            raise errors.InvalidArgument(f"target {key} exists and is not a directory")
        target.mkdir(mode=0o750, parents=True, exist_ok=True)
        with self._present_lock:
            presentation = self._present(ready.name, target, mounter, image=source.image)
            if presentation is not None:
                record["presentation"] = presentation
                tree_dir = target
            else:
                mounter.bind_read_only(tree_dir, target)
            self._set(key, record)
        self.images.complete_in_background(ready.name)
        self.images.collector.request(self.held)
        log.info(
            "msg=%r target=%s volume_id=%s image=%s digest=%s cache_hit=%s mode=fuse "
            "presentation=%s",
            "published",
            key,
            volume_id,
            source.image,
            ready.digest,
            ready.cache_hit,
            record.get("presentation", "fuse"),
        )
        return tree_dir

    def _present(
        self, name: str, target: Path, mounter: mounts.MounterProtocol, *, image: str
    ) -> str | None:
        """Present tree ``name`` on ``target`` at kernel speed when every file is stored:
        linked where hard links into the store work, else an overlay where the mounter
        can; returns the presentation, None: bind the FUSE view instead (a lazy tree
        still fetching)."""
        if self.meta is None:
            return None
        tree = self.mount.tree_index(name)
        if tree is None:
            return None
        if self.images.lazy.plan_path(name).exists() and (
            name in self.images.lazy.broken or not self.meta.complete(tree)
        ):
            return None  # lazy and not complete yet: the FUSE view fetches on first read
        if self.links is not None and self.links.usable():
            try:
                self.links.present(name, tree, target, mounter, image=image)
                return LINKED
            except OSError as exc:  # a full disk, a filesystem refusing: try the overlay
                log.warning(
                    "msg=%r tree=%s error=%r",
                    "cannot present the tree as linked files; trying an overlay",
                    name,
                    str(exc),
                )
                if name not in self.presented(LINKED):
                    self.links.drop(name)
        if not overlay.supported(mounter):
            return None
        try:
            self.meta.present(name, tree, target, mounter, image=image)  # type: ignore[arg-type]
        except (errors.Internal, errors.ResourceExhausted) as exc:  # an old kernel, a full
            # metadata tmpfs: the FUSE view serves this tree
            log.warning(
                "msg=%r tree=%s error=%r",
                "cannot present the tree as an overlay; binding the FUSE view instead",
                name,
                exc.message,
            )
            if name not in self.presented():
                self.meta.drop(name)
            return None
        return OVERLAY

    def _set(self, key: str, record: dict[str, str] | None) -> None:
        if record is None:
            self.registry.release(key, store=holding.FUSE)
        else:
            self.registry.hold(_to_record(key, record))

    def release(self, target: str) -> None:
        """Forget the record of ``target`` (after it was unmounted); idempotent. The
        tree's metadata for overlays goes with the last record that presented it."""
        with self._present_lock:
            found = self.registry.release(target, store=holding.FUSE)
            known = None if found is None else _from_record(found)
            how = known.get("presentation") if known else None
            tree = known["tree"] if known else None
            if how == OVERLAY and self.meta is not None and tree not in self.presented():
                self.meta.drop(str(tree))
            if how == LINKED and self.links is not None and tree not in self.presented(LINKED):
                self.links.drop(str(tree))
                self.images.collector.loosen()  # its variants may have no links left
        self.images.collector.request(self.held)

    def presented(self, presentation: str = OVERLAY) -> set[str]:
        """Trees some record presents as ``presentation`` (an overlay's metadata, a
        linked tree must stay)."""
        return {
            r.hex
            for r in self.registry.all(store=holding.FUSE).values()
            if r.meta.get("presentation") == presentation
        }

    def held(self) -> set[str]:
        """The trees published volumes use or an owner retains (safe from the store's
        collection)."""
        return self.registry.held(store=holding.FUSE) | self.images.retained()

    def holds(self, target: str) -> bool:
        return self.registry.get(target, store=holding.FUSE) is not None

    def published(self) -> int:
        return self.registry.count(store=holding.FUSE)

    def reconcile(self, mounted: set[str]) -> None:
        """Drop records of targets that are no longer mounted (call at start)."""
        for target in list(self.registry.all(store=holding.FUSE)):
            if target not in mounted:
                log.info("msg=%r target=%s", "dropping record of a vanished FUSE mount", target)
                self.release(target)
        if self.meta is not None or self.links is not None:
            self._adopt_presentations()
        if self.meta is not None:
            self.meta.sweep(self.presented())  # metadata no record presents: from a crash
        if self.links is not None and self.links.sweep(self.presented(LINKED)):
            self.images.collector.loosen()  # linked trees of a crash, or half built:
            self.images.collector.request(self.held)  # their variants may go now

    def _adopt_presentations(self) -> None:
        """Record our overlays and linked binds that have no record (a lost holder
        file), volume unknown, so their trees are held and unpublishing them drops
        their metadata or linked tree."""
        for info in mounts.Mounter().mounts():
            if self.registry.get(info.mount_point) is not None:
                continue
            for how, trees in ((OVERLAY, self.meta), (LINKED, self.links)):
                tree = None if trees is None else trees.tree_of(info)
                if tree is None:
                    continue
                log.info(
                    "msg=%r target=%s tree=%s presentation=%s",
                    f"adopting {'an overlay' if how == OVERLAY else 'a linked tree'} "
                    "without a record", info.mount_point, tree, how,
                )  # fmt: skip
                record = {"volume_id": "", "image": "", "tree": tree, "presentation": how}
                self._set(info.mount_point, record)


def _to_record(target: str, known: dict[str, str]) -> holding.Record:
    """A FUSE publisher's record (volume_id, image, tree, presentation) as a holder."""
    meta = {"presentation": known["presentation"]} if known.get("presentation") else {}
    return holding.Record(
        target=target,
        volume_id=known.get("volume_id", ""),
        digest=f"sha256:{known['tree']}",
        store=holding.FUSE,
        image=known.get("image", ""),
        meta=meta,
    )


def _from_record(record: holding.Record) -> dict[str, str]:
    known = {"volume_id": record.volume_id, "image": record.image, "tree": record.hex}
    if record.meta.get("presentation"):
        known["presentation"] = record.meta["presentation"]
    return known
