"""Volumes whose content follows a tag while their pod runs (volume attribute ``refresh``).

Where it sits: a presentation of the node's one store, beside the bind and FUSE
presentations of ``csi.node.publish`` and the store volume (``csi.node.storevolume``).
The Node servicer (``csi.node.server``) hands a volume whose attributes carry ``refresh``
here; the content comes from the same image cache, through the same signature gate and
credential rules, held against eviction as any published tree.

A refresh volume is a **view directory** the plugin bind-mounts read-only on the target,
laid out as kubelet lays out a ConfigMap volume, so that an update is one atomic rename:

    ..sha256_<hex12>/   the tree of one digest: hard links into the cache's tree (no copy)
    ..data ->           the version in use (a symlink, replaced by rename)
    ..digest ->         ..data/..digest, a file holding the digest in use and the image
    manifests ->        ..data/manifests (one symlink per top-level entry)

No mount is made under the view after it is published (a container's mount of the volume
does not receive later mounts), only links and renames, which every reader of the bind
mount sees at once. A reader resolving ``..data`` once (``cd /bundle/..data``) reads one
digest's tree from start to end; paths through the top-level symlinks each resolve to the
version in use at that moment, never to a half-made one. The previous version stays (for
readers still in it, and for rollback); older ones go.

Every ``refresh`` seconds a thread asks the registry where the tag points now (with the
credentials of the last publish, kept in memory only) and, when it moved, fetches the new
digest, links its tree, swaps ``..data`` and tells the pod (event ``ContentRefreshed``
naming the old and new digest) and the plugin's metrics. A plugin restart resumes the
volumes it finds (their records beside the views), refreshing anonymously until the
next publish brings credentials again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from csi import mounter as mounts
from csi.node.publish import Publisher
from csi.volume.request import PodRef, PublishRequest
from rukpak.common import errors, fsio
from rukpak.image.cachestate import Holder
from rukpak.oci.auth import Credentials
from rukpak.oci.reference import Reference
from rukpak.sources.volume import VolumeSource

log = logging.getLogger(__name__)

DATA = "..data"
DIGEST_FILE = "..digest"
VERSION_PREFIX = "..sha256_"
KEEP_VERSIONS = 2
"""Versions a view keeps: the one in use and the one before (readers still in it)."""
REFRESHED = "ContentRefreshed"
REFRESH_FAILED = "ContentRefreshFailed"

EventSink = Callable[[PodRef, str, str, str], None]
Observer = Callable[[str, str], None]  # (volume id, digest now in use)


@dataclass
class RefreshVolume:
    """One published refresh volume."""

    volume_id: str
    target: str
    view: Path
    source: VolumeSource
    credentials: Credentials | None = field(default=None, repr=False)
    pod: PodRef | None = None
    digest: str = ""
    due: float = 0.0
    failing: str = ""


def version_name(digest: str) -> str:
    return VERSION_PREFIX + digest.removeprefix("sha256:")[:12]


def link_tree(tree: Path, dest: Path) -> int:
    """Recreate ``tree`` at ``dest`` (new) with directories made and files hard-linked,
    symlinks copied; the files linked. Never follows a symlink of the tree."""
    dest.mkdir(mode=0o755)
    count = 0
    for root, dirs, files in os.walk(tree, followlinks=False):
        rel = Path(root).relative_to(tree)
        into = dest / rel
        for name in dirs:
            path = Path(root) / name
            if path.is_symlink():
                os.symlink(os.readlink(path), into / name)
            else:
                (into / name).mkdir(mode=0o755)
        for name in files:
            path = Path(root) / name
            if path.is_symlink():
                os.symlink(os.readlink(path), into / name)
            else:
                os.link(path, into / name, follow_symlinks=False)
                count += 1
    for root, dirs, _ in os.walk(dest, topdown=False):  # read-only, as the tree is
        for name in dirs:
            path = Path(root) / name
            if not path.is_symlink():
                path.chmod(0o555)
    return count


def _unseal(path: Path) -> None:
    for root, dirs, _ in os.walk(path):
        for name in dirs:
            p = Path(root) / name
            if not p.is_symlink():
                p.chmod(0o755)
    with contextlib.suppress(FileNotFoundError):
        path.chmod(0o755)


def remove_version(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        _unseal(path)
        shutil.rmtree(path)


@dataclass(kw_only=True, eq=False)
class RefreshVolumes:
    """The refresh volumes of this node: publish, unpublish, and the refresh thread."""

    publisher: Publisher
    mounter: mounts.MounterProtocol
    root: Path
    events: EventSink | None = None
    observe: Observer | None = None
    tick: float = 0.5
    _volumes: dict[str, RefreshVolume] = field(default_factory=dict, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    _thread: threading.Thread | None = field(default=None, init=False, repr=False)

    # --- where things are ----------------------------------------------------------------

    def _view(self, target: Path) -> Path:
        return self.root / hashlib.sha256(str(target).encode()).hexdigest()[:24]

    def _record(self, view: Path) -> Path:
        return view.with_name(view.name + ".json")

    def is_refresh(self, target_path: str) -> bool:
        view = self._view(self.publisher.check_target(target_path))
        return view.exists() or self._record(view).exists()

    # --- publish and unpublish -----------------------------------------------------------

    def publish(
        self,
        volume_id: str,
        target_path: str,
        source: VolumeSource,
        credentials: Credentials | None,
        pod: PodRef | None,
    ) -> Path:
        """Publish a refresh volume (its first version now); idempotent for the same
        volume and image on the same target, which takes the publish's credentials."""
        target = self.publisher.check_target(target_path)
        view = self._view(target)
        with self._lock:
            known = self._volumes.get(str(target))
            if known is not None:
                if (known.volume_id, known.source.image) != (volume_id, source.image):
                    raise errors.AlreadyExists(
                        f"target {target} already holds refresh volume {known.volume_id}; "
                        "unpublish it first"
                    )
                known.credentials, known.pod = credentials, pod or known.pod
                return view
            vol = RefreshVolume(volume_id, str(target), view, source, credentials, pod)
            if view.exists():  # a publish interrupted before: start again
                self._remove_view(vol)
            view.mkdir(mode=0o755, parents=True)
            try:
                self._update(vol)
                self._save(vol)
                target.mkdir(mode=0o750, parents=True, exist_ok=True)
                if mounts.find_on(self.mounter, target) is None:
                    self.mounter.bind_read_only(view, target)
            except BaseException:
                self._remove_view(vol)
                raise
            vol.due = time.monotonic() + source.refresh
            self._volumes[str(target)] = vol
        log.info(
            "msg=%r target=%s volume_id=%s image=%s digest=%s refresh=%s",
            "published refresh volume",
            target,
            volume_id,
            source.image,
            vol.digest,
            source.refresh,
        )
        return view

    def unpublish(self, volume_id: str, target_path: str) -> None:
        """Unmount the view and remove it with every version's hold. Idempotent; the
        target itself is removed by the caller (``Publisher.unpublish``)."""
        target = self.publisher.check_target(target_path)
        with self._lock:
            vol = self._volumes.pop(str(target), None) or RefreshVolume(
                volume_id, str(target), self._view(target), VolumeSource(image="")
            )
            for _ in range(8):
                if mounts.find_on(self.mounter, target) is None:
                    break
                self.mounter.unmount(target)
            self._remove_view(vol)
        log.info("msg=%r target=%s volume_id=%s", "unpublished refresh volume", target, volume_id)

    def _remove_view(self, vol: RefreshVolume) -> None:
        if vol.view.is_dir():
            for entry in sorted(os.listdir(vol.view)):
                if entry.startswith(VERSION_PREFIX):
                    self.publisher.images.release(str(vol.view / entry))
            _unseal(vol.view)
            shutil.rmtree(vol.view, ignore_errors=True)
        self._record(vol.view).unlink(missing_ok=True)

    def _save(self, vol: RefreshVolume) -> None:
        fsio.write_json_atomic(
            self._record(vol.view),
            {
                "volumeId": vol.volume_id,
                "target": vol.target,
                "attributes": vol.source.attributes(),
                "digest": vol.digest,
                "pod": dataclasses.asdict(vol.pod) if vol.pod else None,
            },
        )

    # --- one update ----------------------------------------------------------------------

    def _update(self, vol: RefreshVolume) -> bool:
        """Fetch where the tag points now; when it moved, link the new version, swap
        ``..data`` and drop versions beyond :data:`KEEP_VERSIONS`. Whether it moved."""
        images = self.publisher.images
        platform = vol.source.platform or self.publisher.platform
        resolved = images.resolve_digest(
            vol.source.image, platform=platform, credentials=vol.credentials
        )
        if resolved == vol.digest:
            return False
        pinned = str(Reference.parse(vol.source.image).with_digest(resolved))
        req = PublishRequest(
            volume_id=vol.volume_id,
            target_path=vol.target,
            source=dataclasses.replace(vol.source, image=pinned),
            credentials=vol.credentials,
            pod=vol.pod,
        )
        req = self.publisher.verified(req)  # the signature policies, as any publish
        version = vol.view / version_name(resolved)
        holder = Holder(target=str(version), volume_id=vol.volume_id, image=vol.source.image)
        unpacked = images.ensure(
            req.source.pinned or pinned,
            platform=platform,
            pull_policy=vol.source.pull_policy,
            credentials=vol.credentials,
            holder=holder,
        )
        if not version.exists():
            staging = vol.view / (version.name + ".tmp")
            remove_version(staging)
            link_tree(unpacked.path, staging)
            staging.chmod(0o755)
            (staging / DIGEST_FILE).write_text(f"{unpacked.digest}\n{vol.source.image}\n")
            staging.chmod(0o555)
            os.rename(staging, version)
        self._swap(vol.view, version.name)
        previous, vol.digest = vol.digest, unpacked.digest
        self._prune(vol)
        if previous:
            self._save(vol)
        if self.observe is not None:
            self.observe(vol.volume_id, vol.digest)
        return bool(previous)

    @staticmethod
    def _swap(view: Path, version: str) -> None:
        """Point ``..data`` at ``version`` by one rename, then make the top-level links
        match its entries (new names linked after the swap, gone names unlinked)."""
        tmp = view / (DATA + ".tmp")
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        os.symlink(version, tmp)
        os.rename(tmp, view / DATA)
        wanted = {DIGEST_FILE, *(n for n in os.listdir(view / version) if n != DIGEST_FILE)}
        for name in wanted:
            link = view / name
            if not link.is_symlink():
                with contextlib.suppress(FileExistsError):
                    os.symlink(f"{DATA}/{name}", link)
        for name in os.listdir(view):
            if name.startswith("..") or name in wanted:
                continue
            path = view / name
            if path.is_symlink():
                path.unlink()

    def _prune(self, vol: RefreshVolume) -> None:
        versions = sorted(
            (p for p in vol.view.iterdir() if p.name.startswith(VERSION_PREFIX)),
            key=lambda p: p.stat(follow_symlinks=False).st_mtime,
            reverse=True,
        )
        current = os.readlink(vol.view / DATA)
        kept = [p for p in versions if p.name == current]
        kept += [p for p in versions if p.name != current][: KEEP_VERSIONS - 1]
        for path in versions:
            if path not in kept and not path.name.endswith(".tmp"):
                remove_version(path)
                self.publisher.images.release(str(path))

    # --- the refresh thread --------------------------------------------------------------

    def start(self) -> RefreshVolumes:
        self._thread = threading.Thread(target=self._run, name="refresh", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.tick):
            now = time.monotonic()
            with self._lock:
                due = [v for v in self._volumes.values() if v.due <= now]
            for vol in due:
                self.refresh(vol)

    def refresh(self, vol: RefreshVolume) -> None:
        """One refresh of ``vol``: never raises (a failure is logged and told once)."""
        with self._lock:
            if self._volumes.get(vol.target) is not vol:
                return  # unpublished meanwhile
            before = vol.digest
            try:
                moved = self._update(vol)
            except errors.RukpakError as exc:
                vol.due = time.monotonic() + vol.source.refresh
                if exc.message != vol.failing:
                    vol.failing = exc.message
                    log.warning(
                        "msg=%r target=%s image=%s error=%r",
                        "refresh failed",
                        vol.target,
                        vol.source.image,
                        exc.message,
                    )
                    self._event(vol, "Warning", REFRESH_FAILED, exc.message)
                return
            vol.failing = ""
            vol.due = time.monotonic() + vol.source.refresh
        if moved:
            log.info(
                "msg=%r target=%s image=%s from=%s to=%s",
                "refreshed",
                vol.target,
                vol.source.image,
                before,
                vol.digest,
            )
            self._event(
                vol, "Normal", REFRESHED, f"{vol.source.image} moved from {before} to {vol.digest}"
            )

    def _event(self, vol: RefreshVolume, kind: str, reason: str, message: str) -> None:
        if self.events is None or vol.pod is None:
            return
        try:
            self.events(vol.pod, kind, reason, message)
        except Exception as exc:  # an event is a courtesy
            log.warning("msg=%r pod=%s error=%r", "cannot post event", vol.pod, str(exc))

    def resume(self) -> None:
        """Refresh again the volumes this node still has mounted (call at start)."""
        for record, doc in fsio.json_records(self.root):
            try:
                source = VolumeSource.from_attributes(doc["attributes"])
                pod = PodRef(**doc["pod"]) if doc.get("pod") else None
                vol = RefreshVolume(
                    str(doc["volumeId"]),
                    str(doc["target"]),
                    record.with_suffix(""),
                    source,
                    pod=pod,
                    digest=str(doc.get("digest") or ""),
                )
            except (KeyError, TypeError, errors.RukpakError):
                continue
            if mounts.find_on(self.mounter, Path(vol.target)) is None:
                continue  # unmounted while the plugin was away: unpublish cleans up
            with self._lock:
                self._volumes[vol.target] = vol
            log.info("msg=%r target=%s", "refreshing again", vol.target)
