"""The store volume: one directory per allowed pod in which content appears by digest.

Where it sits: a presentation of the node's one store, beside the bind and FUSE
presentations of ``csi.node.publish``. The Node servicer (``csi.node.server``) hands a
volume with attribute ``kind: store`` here instead of to the publisher. It exists for a
standing provisioner: one long-running pod that mounts one store volume and, for each
BundleDeployment, asks for the pinned content by digest with that BundleDeployment's
pull credential (``rukpak.sources.storeclient``), then reads it from the mount.

Publish: the pod's namespace and ServiceAccount (CSIDriver ``podInfoOnMount``) must be on
the plugin's allow-list (``--store-volume-allow``), else PERMISSION_DENIED (kubelet shows
it as a FailedMount event). The volume's directory ``<kubelet-dir>/plugins/<driver>/store/
<id>`` (``id``: a hash of the target path) is made a mount point in a shared peer group
and bind-mounted read-only on the target; the pod mounts it with
``mountPropagation: HostToContainer``. The plugin serves the request socket in it
(``csi.node.storeserver``).

A request runs the publish spine (``Publisher.publish``: target checks, per-target lock,
deadline, publish slot, signature gate, credential checks and re-checks of private
content, budgets, retention) with the request's credential on the target
``<volume dir>/<digest>``, which propagates into the pod: a digest is visible only after
a request whose credential could read it. A digest already visible is checked again for
every later request's credential (``Publisher.authorize_published``), so an ok answer
always means "this credential may read it".

Unpublish unmounts every digest, stops the socket, unmounts the target and the
directory. Both are idempotent; a plugin restart serves the sockets of the store volumes
it finds again (:meth:`StoreVolumes.resume`), after checking their pods against the
allow-list it now has.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from csi import mounter as mounts
from csi.node.publish import Publisher
from csi.node.storeserver import StoreSocket
from csi.volume.request import PublishRequest
from rukpak.common import errors, fsio
from rukpak.oci import tls as source_tls
from rukpak.sources import cache as sourcecache
from rukpak.sources import storeprotocol as protocol
from rukpak.sources import volume
from rukpak.sources.volume import VolumeSource

log = logging.getLogger(__name__)

POD_NAMESPACE = "csi.storage.k8s.io/pod.namespace"
POD_NAME = "csi.storage.k8s.io/pod.name"
POD_UID = "csi.storage.k8s.io/pod.uid"
POD_SERVICE_ACCOUNT = "csi.storage.k8s.io/serviceAccount.name"
MAX_DIGESTS = 4096
"""Digests one store volume may show at once (each is a bind mount)."""


class StoreMounter(mounts.MounterProtocol, Protocol):
    def share_in_place(self, path: Path) -> None: ...


@dataclass(frozen=True)
class PodInfo:
    """Who mounts the volume, from the attributes kubelet adds with ``podInfoOnMount``."""

    namespace: str
    name: str
    uid: str
    service_account: str

    @classmethod
    def from_attributes(cls, attributes: Mapping[str, str]) -> PodInfo:
        """PermissionDenied when kubelet did not say who the pod is."""
        info = cls(
            namespace=attributes.get(POD_NAMESPACE, ""),
            name=attributes.get(POD_NAME, ""),
            uid=attributes.get(POD_UID, ""),
            service_account=attributes.get(POD_SERVICE_ACCOUNT, ""),
        )
        if not info.namespace or not info.service_account:
            raise errors.PermissionDenied(
                "a store volume is published only to pods on the plugin's allow-list, and this "
                "request does not say which pod asks: set podInfoOnMount: true on the "
                "CSIDriver object (storageclass/csidriver.yaml)"
            )
        return info

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} (ServiceAccount {self.service_account})"


@dataclass(frozen=True)
class AllowList:
    """``NAMESPACE/SERVICEACCOUNT`` entries (``NAMESPACE/*``: any ServiceAccount there)."""

    entries: frozenset[tuple[str, str]] = frozenset()

    @classmethod
    def parse(cls, texts: Iterable[str]) -> AllowList:
        """Entries from flags (each may hold several, comma-separated); InvalidArgument
        naming a malformed one."""
        entries = set()
        for text in texts:
            for item in filter(None, (part.strip() for part in text.split(","))):
                namespace, sep, account = item.partition("/")
                if not sep or not namespace or not account or "/" in account or "*" in namespace:
                    raise errors.InvalidArgument(
                        f"store volume allow-list entry {item!r}: write NAMESPACE/SERVICEACCOUNT "
                        "or NAMESPACE/* (e.g. rukpak-system/rukpak-provisioner)"
                    )
                entries.add((namespace, account))
        return cls(frozenset(entries))

    def allows(self, pod: PodInfo) -> bool:
        return bool({(pod.namespace, pod.service_account), (pod.namespace, "*")} & self.entries)

    def check(self, pod: PodInfo) -> None:
        """PermissionDenied naming the pod unless it is allowed."""
        if self.allows(pod):
            return
        allowed = ", ".join(sorted(f"{n}/{a}" for n, a in self.entries)) or "nobody"
        raise errors.PermissionDenied(
            f"pod {pod} may not mount a store volume: the node plugin allows only {allowed} "
            "(--store-volume-allow NAMESPACE/SERVICEACCOUNT)"
        )


@dataclass(frozen=True)
class StoreVolume:
    """One published store volume: its directory, target and pod."""

    volume_id: str
    target: str
    directory: Path
    pod: PodInfo


@dataclass(kw_only=True, eq=False)
class StoreVolumes:
    """The store volumes of this node: publish, unpublish, requests."""

    publisher: Publisher
    mounter: StoreMounter
    root: Path
    allow: AllowList
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _sockets: dict[str, StoreSocket] = field(default_factory=dict, init=False, repr=False)
    _closing: set[str] = field(default_factory=set, init=False, repr=False)
    """Targets being unpublished."""

    def _directory(self, target: Path) -> Path:
        return self.root / hashlib.sha256(str(target).encode()).hexdigest()[:24]

    def _record(self, directory: Path) -> Path:
        return directory.with_name(directory.name + ".json")  # outside what the pod sees

    def is_store(self, target_path: str) -> bool:
        """Whether ``target_path`` holds (or held) a store volume of this node."""
        directory = self._directory(self.publisher.check_target(target_path))
        return directory.exists() or self._record(directory).exists()

    def publish(self, volume_id: str, target_path: str, pod: PodInfo) -> StoreVolume:
        """Mount a new store volume for an allowed pod on the target. Idempotent."""
        self.allow.check(pod)
        target = self.publisher.check_target(target_path)
        directory = self._directory(target)
        vol = StoreVolume(volume_id, str(target), directory, pod)
        with self._lock:
            current = mounts.find_on(self.mounter, target)
            if current is not None and not current.root.rstrip("/").endswith(directory.name):
                raise errors.AlreadyExists(
                    f"target {target} is already a mount point of other content; unpublish it first"
                )
            self._closing.discard(str(target))
            directory.mkdir(mode=0o755, parents=True, exist_ok=True)
            fsio.write_json_atomic(
                self._record(directory),
                {
                    "volumeId": volume_id,
                    "target": str(target),
                    **{k: v for k, v in dataclasses.asdict(pod).items()},
                },
            )
            self.mounter.share_in_place(directory)
            self._serve(vol)
            if current is None:
                target.mkdir(mode=0o750, parents=True, exist_ok=True)
                self.mounter.bind_read_only(directory, target)
        log.info(
            "msg=%r target=%s volume_id=%s pod=%s/%s service_account=%s",
            "published store volume",
            target,
            volume_id,
            pod.namespace,
            pod.name,
            pod.service_account,
        )
        return vol

    def _serve(self, vol: StoreVolume) -> None:
        if vol.target not in self._sockets:
            self._sockets[vol.target] = StoreSocket(
                vol.directory / protocol.SOCKET_NAME,
                lambda req: self.request(vol, req),
                name=vol.directory.name,
            )

    def request(self, vol: StoreVolume, req: protocol.StoreRequest) -> protocol.StoreAnswer:
        """Make ``req``'s digest visible in ``vol`` once its credential passed; the answer."""
        started = time.monotonic()
        source = req.source or self._image_source(req)
        name, digest = self._name(req, source)
        target = vol.directory / name
        publish = PublishRequest(
            volume_id=vol.volume_id,
            target_path=str(target),
            source=dataclasses.replace(source, publish_mode="bind"),
            credentials=req.credentials,
        )
        try:
            with source_tls.using(source.tls):  # this request's trust, this thread only
                seen = self._present(vol, publish, target)
        except errors.RukpakError as exc:
            log.warning(
                "msg=%r volume=%s ref=%s code=%s error=%r",
                "store volume request refused",
                vol.directory.name,
                req.ref,
                exc.code,
                exc.message[:300],
            )
            raise
        log.info(
            "msg=%r volume=%s ref=%s visible_before=%s seconds=%.3f",
            "store volume request served",
            vol.directory.name,
            req.ref,
            seen,
            time.monotonic() - started,
        )
        return protocol.StoreAnswer(ok=True, digest=digest, path=name)

    @staticmethod
    def _image_source(req: protocol.StoreRequest) -> VolumeSource:
        attributes = {volume.ATTR_IMAGE: req.ref, volume.ATTR_PUBLISH_MODE: "bind"}
        if req.retain_for or req.retain:  # the content asked for is kept, and the listed
            attributes[volume.ATTR_RETAIN_FOR] = req.retain_for
            attributes[volume.ATTR_RETAIN] = " ".join(req.retain or (req.ref,))
        return VolumeSource.from_attributes(attributes)

    @staticmethod
    def _name(req: protocol.StoreRequest, source: VolumeSource) -> tuple[str, str]:
        """Where the content appears in the volume, and the digest to answer: an image's
        digest for both; a git or http tree under its key (one per content and
        credential, so a tree is shown only to the credential that fetched it) with its
        commit or content digest."""
        if source.fetch is None:
            return req.digest, req.digest
        return sourcecache.key_digest(source.fetch), source.fetch.pin

    def _present(self, vol: StoreVolume, publish: PublishRequest, target: Path) -> bool:
        """Publish ``publish`` on ``target`` in ``vol``, or check its credential against
        what is shown there already; whether it was shown before."""
        if mounts.find_on(self.mounter, target) is not None:
            if publish.source.fetch is None:
                self.publisher.authorize_published(publish)
            else:  # the key holds the credential: record the retention, nothing to check
                self.publisher.publish(publish)
            seen = True
        else:
            if self._digests(vol) >= MAX_DIGESTS:
                raise errors.ResourceExhausted(
                    f"the store volume shows {MAX_DIGESTS} digests already; a standing "
                    "provisioner needs far fewer: remount it"
                )
            self.publisher.publish(publish)
            seen = False
            if vol.target in self._closing:  # unpublish listed the digests before this
                self.publisher.unpublish(vol.volume_id, str(target))
                raise errors.Aborted("the store volume was unpublished during the request")
        return seen

    def _digests(self, vol: StoreVolume) -> int:
        with contextlib.suppress(OSError):
            return sum(1 for name in os.listdir(vol.directory) if name.startswith("sha256:"))
        return 0

    def unpublish(self, volume_id: str, target_path: str) -> None:
        """Unmount every digest, stop the socket, unmount the target and the directory,
        forget the volume. Idempotent; the target itself is removed by the caller
        (``Publisher.unpublish``)."""
        target = self.publisher.check_target(target_path)
        directory = self._directory(target)
        with self._lock:
            self._closing.add(str(target))
            server = self._sockets.pop(str(target), None)
            if server is not None:
                server.stop()
            with contextlib.suppress(FileNotFoundError):
                (directory / protocol.SOCKET_NAME).unlink()
            if directory.is_dir():
                for name in sorted(os.listdir(directory)):
                    if protocol.DIGEST_RE.match(name):
                        self.publisher.unpublish(volume_id, str(directory / name))
            self.publisher.unpublish(volume_id, str(target))
            for _ in range(8):
                if mounts.find_on(self.mounter, directory) is None:
                    break
                self.mounter.unmount(directory)
            with contextlib.suppress(FileNotFoundError):
                directory.rmdir()
            self._record(directory).unlink(missing_ok=True)
            self._closing.discard(str(target))
        log.info("msg=%r target=%s volume_id=%s", "unpublished store volume", target, volume_id)

    def resume(self) -> None:
        """Serve the sockets of the store volumes this node still has mounted (call at
        start, after ``Publisher.reconcile``); a volume whose pod the allow-list no longer
        names keeps what it shows but gets no socket."""
        for record, doc in fsio.json_records(self.root):
            directory = record.with_suffix("")
            try:
                pod = PodInfo(
                    namespace=str(doc["namespace"]),
                    name=str(doc["name"]),
                    uid=str(doc["uid"]),
                    service_account=str(doc["service_account"]),
                )
                vol = StoreVolume(str(doc["volumeId"]), str(doc["target"]), directory, pod)
            except KeyError:
                continue
            if mounts.find_on(self.mounter, Path(vol.target)) is None:
                continue  # unmounted while the plugin was away: unpublish will clean up
            if not self.allow.allows(pod):
                log.warning(
                    "msg=%r target=%s pod=%s",
                    "store volume's pod no longer allowed",
                    vol.target,
                    pod,
                )
                continue
            with self._lock:
                self._serve(vol)
            log.info("msg=%r target=%s", "serving store volume again", vol.target)

    def stop(self) -> None:
        """Stop every socket (the mounts stay for the next plugin process)."""
        with self._lock:
            for server in self._sockets.values():
                server.stop()
            self._sockets.clear()
