"""The FUSE mode, assembled: image cache, filesystem, daemon and holder for one plugin.

Where it sits: built by the plugin process (``csi.plugin.main``) when FUSE mode
is enabled, started beside the gRPC server and stopped after it. Layout under
``root`` (the plugin's ``<state-dir>/fuse``)::

    store/        file store and tree indexes (csi.fuse.images)
    slots.json    tree → inode slot (csi.fuse.fs)
    holders/      target → tree (rukpak.store.holders), unless the plugin passes the
                  node's one registry; a publishes.json of older plugins is taken over
    meta/         a private tmpfs of metadata trees for overlays (csi.fuse.overlay)
    store/linked/ linked trees, hard links into the file store (csi.fuse.linked)
    mnt/          the FUSE mount (default; the holder mounts it)
    holder.sock   the holder's socket (default)

Without ``holder_socket`` a holder is started in its own session when none
answers on the default socket, so it outlives this process (not its
container). With ``holder_socket`` the holder is someone else's: in a cluster
it runs as its own container of the plugin's pod (``daemonset/``), so a
plugin container that crashes, is killed or OOM-killed and restarted finds
the same mount; the plugin waits for it and never starts one, which would
race the container's holder for the mountpoint.

Fully fetched trees are presented as read-only binds of linked trees
(``csi.fuse.linked``), reads at bind mode's speed, or as overlays
(``csi.fuse.overlay``) where hard links into the store are impossible;
``linked_trees=False``, or ``FUSE_LINKED=false``, keeps the overlay; ``overlay=False``,
or the environment variable ``FUSE_OVERLAY=false``, keeps every volume on the FUSE
view.
"""

from __future__ import annotations

import logging
import os
import subprocess
from pathlib import Path

from csi import mounter as mounts
from csi.fuse import fs, index, linked, overlay
from csi.fuse.images import FuseImages
from csi.fuse.publisher import FusePublisher
from csi.fuse.session import HolderClient, Session, spawn_holder, wait_for_socket
from rukpak.common import errors
from rukpak.image import grants
from rukpak.image.seams import Observer, PullerFactory
from rukpak.image.settings import DEFAULTS, CacheSettings
from rukpak.store.holders import Holders

log = logging.getLogger(__name__)

HOLDER_WAIT = 60.0  # seconds for an external holder (a container starting beside us)


class FuseService:
    """One plugin's FUSE mode: ``start`` serves the mount, ``stop`` leaves it to the holder."""

    def __init__(
        self,
        root: Path,
        *,
        puller_factory: PullerFactory,
        shared_grants: grants.Grants,
        settings: CacheSettings = DEFAULTS,
        holder_socket: Path | None = None,
        mountpoint: Path | None = None,
        overlay_trees: bool | None = None,
        linked_trees: bool | None = None,
        holders: Holders | None = None,
        observer: Observer | None = None,
    ) -> None:
        """``shared_grants``: bind mode's credential checks, so that both modes re-check a
        pod's credentials against a private image once (``--private-image-auth-ttl``);
        ``holders``: the node's holder registry, bind mode's; ``observer``: bind mode's
        metrics."""
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.root = root
        self.images = FuseImages(
            root / "store",
            puller_factory=puller_factory,
            settings=settings,
            shared_grants=shared_grants,
            observer=observer,
        )
        self.trees = fs.Trees(self.images.trees_dir, root / "slots.json", self.images.files)
        self.images.on_forget.append(self.trees.forget)
        self.images.on_indexed.append(self.trees.offer)
        self.ops = fs.ReadOnlyFS(self.trees, self.images.files, fetcher=self.images.lazy)
        self.external_holder = holder_socket is not None
        self.holder_socket = holder_socket or root / "holder.sock"
        self.mountpoint = mountpoint or root / "mnt"
        if overlay_trees is None:
            overlay_trees = os.environ.get("FUSE_OVERLAY", "true") != "false"
        if linked_trees is None:
            linked_trees = os.environ.get("FUSE_LINKED", "true") != "false"
        self.meta: overlay.MetaTrees | None = None
        self.links: linked.LinkedTrees | None = None
        if overlay_trees:
            try:
                self.meta = overlay.MetaTrees(root / "meta", self.images.files)
            except errors.InvalidArgument as exc:
                log.warning("msg=%r error=%r", "fetched trees stay on the FUSE view", exc.message)
        if self.meta is not None and linked_trees:
            self.links = linked.LinkedTrees(
                self.images.files.root / "linked", self.images.files, self.meta.verifier
            )
        self.publisher = FusePublisher(
            self.images,
            self,
            root / "publishes.json",
            meta=self.meta,
            links=self.links,
            holders=holders,
        )
        self.holder_process: subprocess.Popen[bytes] | None = None
        self._session: Session | None = None
        self._holder: HolderClient | None = None
        self._holder_id = ""

    def tree_dir(self, name: str) -> Path:
        return self.mountpoint / name

    def tree_index(self, name: str) -> index.Index | None:
        """Tree ``name``'s loaded index (None when the store holds none)."""
        return self.trees.get(self.trees.slot(name)) if self.trees.exists(name) else None

    def start(self) -> None:
        client = HolderClient(self.holder_socket)
        if not client.alive() and self.external_holder:
            log.info("msg=%r socket=%s", "waiting for the FUSE holder", self.holder_socket)
            if not wait_for_socket(self.holder_socket, HOLDER_WAIT):
                raise errors.Unavailable(
                    f"no FUSE holder answers on {self.holder_socket} after {HOLDER_WAIT:.0f} s; "
                    "start it (python -m csi.fuse.holder, the fuse-holder container) or leave "
                    "--fuse-holder-socket unset to let the plugin start one"
                )
        elif not client.alive():
            log.info("msg=%r socket=%s", "starting a FUSE holder", self.holder_socket)
            self.holder_process = spawn_holder(self.mountpoint, self.holder_socket)
        self._holder = client
        self._holder_id = client.ident()
        self._session = Session(self.ops, client)
        self._session.start()
        self.mountpoint = self._session.mountpoint
        self.images.keeper = client
        restored = self.images.restore_credentials(client.credentials())
        if restored:
            log.info("msg=%r trees=%d", "lazy trees' credentials taken back", restored)
        self.images.resume_lazy()

    def healthy(self) -> bool:
        """The daemon serves, and the holder is the one whose mount it serves (a replaced
        holder has a new mount no daemon answers: only a plugin restart re-attaches)."""
        if self._session is None or self._session.failed is not None:
            return False
        return self._holder is not None and self._holder.ident() == self._holder_id

    def stop(self) -> None:
        """Stop the daemon and unmount the metadata tmpfs (published overlays keep what
        they use: the kernel holds it until their last unmount)."""
        if self._session is not None:
            self._session.stop()
            self._session = None
        if self.meta is not None:
            unmount_meta(self.meta.root)


def unmount_meta(root: Path) -> None:
    """Detach every tmpfs mounted on ``root`` (idempotent)."""
    mounter = mounts.Mounter()
    for _ in range(4):
        if mounts.find(mounter.mounts(), root) is None:
            return
        try:
            mounter.detach(root)
        except errors.RukpakError as exc:
            log.warning("msg=%r path=%s error=%r", "cannot unmount the metadata tmpfs", root, exc)
            return
