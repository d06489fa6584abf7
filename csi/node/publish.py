"""The publish core: volume attributes → image tree → read-only bind mount on the target.

Where it sits: between the Node servicer (``csi.node.server``), which turns
gRPC requests into the plain dataclasses here, and the image cache
(``rukpak.image.cache``) plus the mount seam (``csi.mounter``).

Idempotency, as CSI demands:

* publishing the same volume and image on the same target again is success;
  a different volume or image on a mounted target is AlreadyExists;
* unpublishing unmounts if mounted, removes the target directory and is
  success when nothing is there.

Retention: a publish whose source names an owner (volume attributes ``retainFor`` and
``retain``, ``rukpak.sources.volume``) then records the trees that owner keeps: the
published content (its pod unmounts when it ends) and every ``retain`` entry a store
holds, images and git or http trees alike, in the bind cache (``ImageCache.retain``)
and, when FUSE mode is on, in the FUSE store (``FuseImages.retain``: a kept revision
may have been published in either mode), so eviction spares them. It never fails the
publish: a retention that cannot be recorded is a warning.

Safety: targets must lie strictly inside the configured kubelet directory
(after resolving symlinks in their parent) and must not themselves be symlinks;
nothing is mounted or removed anywhere else.

Time: every publish has one deadline (``--publish-deadline``, at most what the
client's own deadline leaves), for every source and both modes, retries included.
It bounds the wait for a publish slot (at most ``PUBLISH_SLOTS`` publishes fetch at
once), is handed to the source fetchers and is in force
(``rukpak.common.backoff.within``) for the registry client the image cache and the
FUSE publisher create, which derive their timeouts and backoff from what remains of
it. When it passes, the publish answers DEADLINE_EXCEEDED naming the server: kubelet
(which gives up on its own after 2 minutes) shows that message in the pod's events,
treats the volume as possibly in progress and calls again later.

Signature events: when signature policies select a volume's image, the pod it is
published for (``PublishRequest.pod``) gets an event through ``events`` (the node
plugin's :meth:`csi.node.policies.PolicyWatch.post_event`): Normal ``SignatureVerified``
naming the digest, the policies and what satisfied each (the signer's authority), or
Warning ``SignatureRefused`` with the policy's reason. Posting never blocks nor fails the
publish.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from csi import mounter as mounts
from csi.volume.request import PodRef, PublishRequest
from rukpak.common import backoff, errors
from rukpak.common.backoff import Deadline
from rukpak.image.cache import ImageCache
from rukpak.image.cachestate import Holder
from rukpak.image.locks import KeyedLocks
from rukpak.oci.manifest import Platform
from rukpak.signing.gate import Gate, SignatureDenied
from rukpak.sources import volume
from rukpak.sources.cache import SourceCache
from rukpak.sources.volume import VolumeSource

if TYPE_CHECKING:
    from csi.fuse.publisher import FusePublisher

log = logging.getLogger(__name__)

EventSink = Callable[[PodRef, str, str, str], None]
"""Posts an event on a pod: (pod, type Normal|Warning, reason, message)."""
NORMAL, WARNING = "Normal", "Warning"
VERIFIED = "SignatureVerified"
REFUSED = "SignatureRefused"

PUBLISH_DEADLINE = 90.0
"""Seconds a publish may take by default, retries included (kubelet waits 2 minutes)."""
PUBLISH_SLOTS = 8
"""Publishes that fetch at once; others wait for a slot, within their deadline."""
CLIENT_MARGIN = 5.0
"""Seconds (at most a tenth of its own) kept for the answer to reach a client whose own
deadline comes first."""


class Publisher:
    """Publishes and unpublishes bundle volumes on this node."""

    def __init__(
        self,
        *,
        images: ImageCache,
        mounter: mounts.MounterProtocol,
        kubelet_dir: Path,
        platform: Platform | None = None,
        fuse: FusePublisher | None = None,
        default_mode: str = "bind",
        sources: SourceCache | None = None,
        deadline: float = PUBLISH_DEADLINE,
        slots: int = PUBLISH_SLOTS,
        gate: Gate | None = None,
        events: EventSink | None = None,
    ) -> None:
        self.images = images
        self.sources = sources or SourceCache(images)  # git and http volumes
        self.mounter = mounter
        self.kubelet_dir = Path(os.path.realpath(kubelet_dir))
        self.platform = platform or Platform.current()
        self.fuse = fuse  # publishMode fuse (csi.fuse.publisher); None: FUSE mode is off
        self.default_mode = default_mode
        self.deadline_seconds = deadline
        self.slots = slots
        self._slots = threading.BoundedSemaphore(slots)
        self._locks = KeyedLocks()
        self.gate = gate  # signature policies (rukpak.signing.gate); None: none checked
        self.events = events  # the pod's signature events; None: none posted

    def deadline(self, client_seconds: float | None = None) -> Deadline:
        """A new publish's deadline: ``--publish-deadline`` from now, or sooner when the
        client (kubelet: 2 minutes) will stop waiting before that."""
        seconds = self.deadline_seconds
        if client_seconds is not None:
            margin = min(CLIENT_MARGIN, client_seconds / 10)
            seconds = max(0.0, min(seconds, client_seconds - margin))
        return Deadline.after(seconds, what="the publish deadline (--publish-deadline)")

    @contextlib.contextmanager
    def _slot(self, deadline: Deadline, what: str) -> Iterator[None]:
        """One of the ``slots`` publishes that may fetch at once, waited for until the
        deadline."""
        if not self._slots.acquire(timeout=deadline.remaining()):
            raise deadline.exceeded(
                f"publishing {what}",
                detail=f"waiting for one of the {self.slots} publishes in progress to finish",
            )
        try:
            yield
        finally:
            self._slots.release()

    def check_target(self, target_path: str) -> Path:
        """The real path to mount on; InvalidArgument unless strictly inside the kubelet dir."""
        if "\0" in target_path:
            raise errors.InvalidArgument(
                f"target_path {target_path[:200]!r} contains a NUL byte; pass a plain path"
            )
        if not target_path.startswith("/"):
            raise errors.InvalidArgument(f"target_path {target_path!r} must be absolute")
        normal = Path(os.path.normpath(target_path))
        real = Path(os.path.realpath(normal.parent)) / normal.name
        if (
            normal.name in ("", ".", "..")
            or not real.is_relative_to(self.kubelet_dir)
            or (real == self.kubelet_dir)
        ):
            raise errors.InvalidArgument(
                f"target_path {target_path!r} is outside the kubelet directory "
                f"{self.kubelet_dir}; the plugin only mounts there (see --kubelet-dir)"
            )
        if real.is_symlink():
            raise errors.InvalidArgument(f"target_path {target_path!r} is a symlink")
        return real

    def publish(self, req: PublishRequest, *, deadline: Deadline | None = None) -> Path:
        """Bind-mount the image tree read-only on the target; returns the tree. Idempotent.

        DeadlineExceeded, naming the server, when ``deadline`` (default: :meth:`deadline`)
        passes first.
        """
        deadline = deadline or self.deadline()
        target = self.check_target(req.target_path)
        with backoff.within(deadline):
            return self._publish(req, target, deadline)

    def _publish(self, req: PublishRequest, target: Path, deadline: Deadline) -> Path:
        key = str(target)
        with self._locks.hold(key):
            if req.source.fetch is not None:
                return self._publish_fetched(req, target, deadline)
            fuse_mode = (req.source.publish_mode or self.default_mode) == "fuse"
            current = None
            if self.gate is not None or not fuse_mode:
                current = mounts.find_on(self.mounter, target)
            if self.gate is not None and current is None:
                req = self._checked(req)  # a mounted target was checked when it was mounted
            if fuse_mode:
                if self.fuse is None:
                    raise errors.FailedPrecondition(
                        "publishMode fuse is not enabled on this node: start the plugin with "
                        "--fuse, or use publishMode bind"
                    )
                with self._slot(deadline, req.source.image):
                    path = self.fuse.publish(
                        req, target, platform=self.platform, mounter=self.mounter
                    )
                self._retain(req.source)
                return path
            if current is not None:
                known = self.images.holder(key)
                same = (
                    known is not None
                    and known.volume_id == req.volume_id
                    and known.image == req.source.image
                )
                if same:
                    log.info(
                        "msg=%r target=%s volume_id=%s", "already published", key, req.volume_id
                    )
                    digest = self.images.holder_digest(key)
                    if digest is not None and self.images.has_tree(digest):
                        self._retain(req.source)
                        return self.images.tree_path(digest)
                    # The digest record is lost: resolve again and compare the mount below.
                elif known is not None and known.volume_id:
                    raise errors.AlreadyExists(
                        f"target {key} already holds volume {known.volume_id} with image "
                        f"{known.image}; unpublish it first"
                    )
                elif known is None and (other := self.images.registry.get(key)) is not None:
                    # Another presentation's (FUSE) holder: left as it is.
                    raise errors.AlreadyExists(
                        f"target {key} already holds volume {other.volume_id or '(unknown)'} "
                        f"with image {other.image or '(unknown)'}; unpublish it first"
                    )
            holder = Holder(target=key, volume_id=req.volume_id, image=req.source.image)
            with self._slot(deadline, req.source.image):
                unpacked = self.images.ensure(
                    req.source.pinned or req.source.image,
                    platform=req.source.platform or self.platform,
                    pull_policy=req.source.pull_policy,
                    credentials=req.credentials,
                    holder=holder,
                )
            if current is not None:
                # Mounted, but its volume was not recorded (state lost): same tree → OK.
                if current.root.rstrip("/").endswith("/" + unpacked.path.name):
                    self._retain(req.source)
                    return unpacked.path
                self.images.release(key)
                raise errors.AlreadyExists(
                    f"target {key} is already a mount point of other content; unpublish it first"
                )
            self._bind(unpacked.path, target)
            log.info(
                "msg=%r target=%s volume_id=%s image=%s digest=%s cache_hit=%s",
                "published",
                key,
                req.volume_id,
                req.source.image,
                unpacked.digest,
                unpacked.cache_hit,
            )
            self._retain(req.source)
            return unpacked.path

    def authorize_published(self, req: PublishRequest, *, deadline: Deadline | None = None) -> None:
        """For a presentation that shows one published target to many credentials (the
        store volume, ``csi.node.storevolume``): check ``req``'s credential against the
        content already bind-published at its target as a first publish would (the image
        cache's pull policy and re-check of private trees, ``rukpak.image.grants``) and
        record its retention; nothing is mounted. PermissionDenied when the credential
        cannot read it."""
        deadline = deadline or self.deadline()
        target = self.check_target(req.target_path)
        key = str(target)
        with backoff.within(deadline), self._locks.hold(key):
            holder = Holder(target=key, volume_id=req.volume_id, image=req.source.image)
            with self._slot(deadline, req.source.image):
                self.images.ensure(
                    req.source.pinned or req.source.image,
                    platform=req.source.platform or self.platform,
                    pull_policy=req.source.pull_policy,
                    credentials=req.credentials,
                    holder=holder,
                )
            self._retain(req.source)

    def verified(self, req: PublishRequest) -> PublishRequest:
        """``req`` with every signature policy selecting its image satisfied (pinned to
        the digest verified), as a publish checks it; unchanged without policies.
        PermissionDenied naming the policy when one refuses it."""
        return req if self.gate is None else self._checked(req)

    def _checked(self, req: PublishRequest) -> PublishRequest:
        """The request to fetch: with every signature policy selecting its image satisfied,
        pinned to the digest verified (so the bytes fetched are those); unchanged when no
        policy selects it. PermissionDenied naming the policy when one refuses it: nothing
        is fetched or cached then."""
        assert self.gate is not None
        try:
            verdict = self.gate.check(req.source.image, req.credentials)
        except SignatureDenied as exc:
            self._event(req, WARNING, REFUSED, exc.message)
            raise
        if verdict is None:
            return req
        for warning in verdict.warnings:
            log.warning("msg=%r image=%s %s", "signature policy warning", req.source.image, warning)
        passed = "; ".join((*verdict.verified, *verdict.warnings)) or ", ".join(verdict.policies)
        self._event(req, NORMAL, VERIFIED, f"image {req.source.image} ({verdict.digest}): {passed}")
        return dataclasses.replace(
            req, source=dataclasses.replace(req.source, pinned=verdict.pinned)
        )

    def _event(self, req: PublishRequest, kind: str, reason: str, message: str) -> None:
        """Tell the volume's pod about its signature check; never raises."""
        if self.events is None or req.pod is None:
            return
        try:
            self.events(req.pod, kind, reason, message)
        except Exception as exc:  # an event is a courtesy: the publish goes on
            log.warning(
                "msg=%r pod=%s reason=%s error=%r", "cannot post event", req.pod, reason, str(exc)
            )

    def _retain(self, source: VolumeSource) -> None:
        """Record what ``source``'s owner retains (see the module docstring); never raises."""
        if not source.retain_for:
            return
        entries = list(dict.fromkeys((source.image, *source.retain)))
        labels = [e for e in entries if volume.is_fetch_label(e)]
        refs = [e for e in entries if not volume.is_fetch_label(e)]
        platform = source.platform or self.platform
        try:
            kept = self.images.retain(source.retain_for, refs, platform, labels=labels)
            if self.fuse is not None:
                kept += self.fuse.images.retain(source.retain_for, refs, platform)
        except Exception as exc:  # a publish that mounted stays published
            log.warning(
                "msg=%r owner=%s error=%r",
                "cannot record retained images",
                source.retain_for,
                str(exc)[:300],
            )
            return
        log.info(
            "msg=%r owner=%s retained=%d asked=%d",
            "retained images",
            source.retain_for,
            len(set(kept)),
            len(entries),
        )

    def _bind(self, tree: Path, target: Path) -> None:
        """Bind ``tree`` read-only at ``target`` (made if missing); on failure the hold
        taken for ``target`` is released."""
        try:
            if target.exists() and not target.is_dir():
                raise errors.InvalidArgument(f"target {target} exists and is not a directory")
            target.mkdir(mode=0o750, parents=True, exist_ok=True)
            self.mounter.bind_read_only(tree, target)
        except BaseException:
            self.images.release(str(target))
            raise

    def _publish_fetched(self, req: PublishRequest, target: Path, deadline: Deadline) -> Path:
        """Publish a git or http volume (always a bind mount of its tree). Idempotent."""
        assert req.source.fetch is not None
        key = str(target)
        holder = Holder(target=key, volume_id=req.volume_id, image=req.source.image)
        if mounts.find_on(self.mounter, target) is not None:
            known = self.images.holder(key)
            digest = self.images.holder_digest(key)
            if known == holder and digest is not None and self.images.has_tree(digest):
                self._retain(req.source)
                return self.images.tree_path(digest)
            raise errors.AlreadyExists(
                f"target {key} already holds other content; unpublish it first"
            )
        with self._slot(deadline, req.source.fetch.label()):
            unpacked = self.sources.ensure(req.source.fetch, holder=holder, deadline=deadline)
        self._bind(unpacked.path, target)
        log.info(
            "msg=%r target=%s volume_id=%s source=%s cache_hit=%s",
            "published",
            key,
            req.volume_id,
            req.source.image,
            unpacked.cache_hit,
        )
        self._retain(req.source)
        return unpacked.path

    def unpublish(self, volume_id: str, target_path: str) -> None:
        """Unmount and remove the target; success if it is not there. Idempotent."""
        target = self.check_target(target_path)
        key = str(target)
        with self._locks.hold(key):
            for _ in range(8):  # stacked mounts: peel them all
                if mounts.find_on(self.mounter, target) is None:
                    break
                self.mounter.unmount(target)
            try:
                if target.is_dir():
                    target.rmdir()
                else:
                    target.unlink(missing_ok=True)
            except OSError as exc:
                if exc.errno == errno.ENOTEMPTY:
                    raise errors.FailedPrecondition(
                        f"target {key} is not a mount point but has content; refusing to delete it"
                    ) from None
                raise
            self.images.release(key)
            if self.fuse is not None:
                self.fuse.release(key)
            log.info("msg=%r target=%s volume_id=%s", "unpublished", key, volume_id)

    def reconcile(self) -> None:
        """Make recorded holders match the mount table (call at start).

        Records for targets that are no longer mounted are dropped; mounts of our
        trees under the kubelet dir without a record are adopted (volume unknown),
        so eviction never removes a tree that is in use.
        """
        table = self.mounter.mounts()
        mounted = {m.mount_point: m for m in table}
        if self.fuse is not None:
            self.fuse.reconcile(set(mounted))
        for target in list(self.images.holders()):
            if target not in mounted:
                log.info("msg=%r target=%s", "dropping record of a vanished mount", target)
                self.images.release(target)
        holders = self.images.holders()
        for m in table:
            point = Path(m.mount_point)
            parent, name = os.path.split(m.root.rstrip("/"))
            if (
                os.path.basename(parent) != "unpacked"
                or m.mount_point in holders
                or not point.is_relative_to(self.kubelet_dir)
            ):
                continue
            digest = f"sha256:{name}"
            with contextlib.suppress(errors.InvalidArgument):
                if self.images.has_tree(digest):
                    log.info("msg=%r target=%s digest=%s", "adopting mount", m.mount_point, digest)
                    self.images.hold(digest, Holder(m.mount_point, volume_id="", image=""))

    def published(self) -> int:
        return len(self.images.holders()) + (self.fuse.published() if self.fuse else 0)
