"""The FUSE publish path: volume → tree index → read-only bind of its directory in the mount.

Where it sits: the node's publish core (``csi.node.publish.Publisher``) hands
volumes whose ``publishMode`` is ``fuse`` to :meth:`FusePublisher.publish`,
under its per-target lock and after its target checks; unpublishing is the
same unmount for both modes, then :meth:`FusePublisher.release`. Below it: the
FUSE image cache (``csi.fuse.images``) and the mount (``csi.fuse.service``).

A tree whose every file is in the store is presented at kernel speed: an overlayfs
on the target over a metadata tree and the store's files (``csi.fuse.overlay``; the
record says ``"presentation": "overlay"``). A lazy tree with files still to fetch is
bound from the FUSE mount, so a volume is readable before its files arrive; once
fetched, new publishes of it get the overlay.

After each publish and unpublish the store's collection runs in the background
(``csi.fuse.collect``): trees no record holds and no owner retains
(``FuseImages.retained``) may go when over budget.

Idempotency matches bind mode: the same volume and image on the same target
again is success; anything else on a mounted target is AlreadyExists. Which
target holds which tree is recorded in ``publishes.json`` (atomically), so a
restart knows the trees in use.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Protocol

from csi import mounter as mounts
from csi.fuse import index, overlay
from csi.fuse.images import FuseImages
from csi.volume.request import PublishRequest
from rukpak.common import errors
from rukpak.common.fsio import read_json_or_set_aside, write_json_atomic
from rukpak.oci.manifest import Platform

log = logging.getLogger(__name__)

OVERLAY = "overlay"


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
    ) -> None:
        """``meta``: present fully fetched trees as overlays (None: always the FUSE view)."""
        self.images = images
        self.mount = mount
        self.meta = meta
        self.records_path = records
        self._lock = threading.Lock()
        self._present_lock = threading.Lock()  # a tree's metadata is not dropped mid-publish
        loaded = read_json_or_set_aside(records)
        self._records: dict[str, dict[str, str]] = dict(loaded) if isinstance(loaded, dict) else {}

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
        known = self._records.get(key)
        if known is not None and not known["volume_id"]:
            known = None  # adopted at start (volume unknown): this publish names it again
        if current is not None and known is not None:
            if known["volume_id"] == volume_id and known["image"] == source.image:
                log.info("msg=%r target=%s volume_id=%s", "already published", key, volume_id)
                return (
                    target
                    if known.get("presentation") == OVERLAY
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
            raise errors.AlreadyExists(
                f"target {key} is already a mount point of other content; unpublish it first"
            )
        if target.exists() and not target.is_dir():
            raise errors.InvalidArgument(f"target {key} exists and is not a directory")
        target.mkdir(mode=0o750, parents=True, exist_ok=True)
        with self._present_lock:
            if self._present(ready.name, target, mounter, image=source.image):
                record["presentation"] = OVERLAY
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
    ) -> bool:
        """Mount the overlay of tree ``name`` on ``target`` when every file is stored and
        the mounter can; False: bind the FUSE view instead (a lazy tree still fetching)."""
        if self.meta is None or not overlay.supported(mounter):
            return False
        tree = self.mount.tree_index(name)
        if tree is None:
            return False
        if self.images.lazy.plan_path(name).exists() and (
            name in self.images.lazy.broken or self.meta.missing(tree)
        ):
            return False  # lazy and not complete yet: the FUSE view fetches on first read
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
            return False
        return True

    def _set(self, key: str, record: dict[str, str] | None) -> None:
        with self._lock:
            if record is None:
                if self._records.pop(key, None) is None:
                    return
            else:
                self._records[key] = record
            # Not fsynced: records describe mounts, which a power loss ends anyway.
            write_json_atomic(self.records_path, self._records, durable=False)

    def release(self, target: str) -> None:
        """Forget the record of ``target`` (after it was unmounted); idempotent. The
        tree's metadata for overlays goes with the last record that presented it."""
        with self._present_lock:
            with self._lock:
                known = self._records.get(target)
            self._set(target, None)
            tree = known["tree"] if known and known.get("presentation") == OVERLAY else None
            if self.meta is not None and tree is not None and tree not in self.presented():
                self.meta.drop(tree)
        self.images.collector.request(self.held)

    def presented(self) -> set[str]:
        """Trees some record presents as an overlay (their metadata must stay)."""
        with self._lock:
            return {r["tree"] for r in self._records.values() if r.get("presentation") == OVERLAY}

    def held(self) -> set[str]:
        """The trees published volumes use or an owner retains (safe from the store's
        collection)."""
        with self._lock:
            used = {record["tree"] for record in self._records.values()}
        return used | self.images.retained()

    def holds(self, target: str) -> bool:
        return target in self._records

    def published(self) -> int:
        return len(self._records)

    def reconcile(self, mounted: set[str]) -> None:
        """Drop records of targets that are no longer mounted (call at start)."""
        for target in list(self._records):
            if target not in mounted:
                log.info("msg=%r target=%s", "dropping record of a vanished FUSE mount", target)
                self.release(target)
        if self.meta is not None:
            self._adopt_overlays()
            self.meta.sweep(self.presented())  # metadata no record presents: from a crash

    def _adopt_overlays(self) -> None:
        """Record our overlays that have no record (a lost ``publishes.json``), volume
        unknown, so their trees are held and unpublishing them drops their metadata."""
        assert self.meta is not None
        for info in mounts.Mounter().mounts():
            tree = self.meta.tree_of(info)
            if tree is not None and info.mount_point not in self._records:
                log.info(
                    "msg=%r target=%s tree=%s", "adopting an overlay without a record",
                    info.mount_point, tree,
                )  # fmt: skip
                record = {"volume_id": "", "image": "", "tree": tree, "presentation": OVERLAY}
                self._set(info.mount_point, record)
