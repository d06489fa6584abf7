"""The FUSE mode, assembled: image cache, filesystem, daemon and holder for one plugin.

Where it sits: built by the plugin process (``csi.plugin.main``) when FUSE mode
is enabled, started beside the gRPC server and stopped after it. Layout under
``root`` (the plugin's ``<state-dir>/fuse``)::

    store/        file store and tree indexes (csi.fuse.images)
    slots.json    tree → inode slot (csi.fuse.fs)
    publishes.json  target → tree (csi.fuse.publisher)
    mnt/          the FUSE mount (default; the holder mounts it)
    holder.sock   the holder's socket (default)

When no holder answers on the socket, one is started in its own session so it
outlives this process; in a cluster it runs as its own container and the
plugin finds it on a shared socket.
"""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

from csi.fuse import fs
from csi.fuse.images import FuseImages
from csi.fuse.publisher import FusePublisher
from csi.fuse.session import HolderClient, Session, spawn_holder
from csi.image import extract
from csi.image.seams import PullerFactory

log = logging.getLogger(__name__)


class FuseService:
    """One plugin's FUSE mode: ``start`` serves the mount, ``stop`` leaves it to the holder."""

    def __init__(
        self,
        root: Path,
        *,
        puller_factory: PullerFactory,
        limits: extract.Limits | None = None,
        holder_socket: Path | None = None,
        mountpoint: Path | None = None,
    ) -> None:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.root = root
        self.images = FuseImages(root / "store", puller_factory=puller_factory, limits=limits)
        self.trees = fs.Trees(self.images.trees_dir, root / "slots.json")
        self.ops = fs.ReadOnlyFS(self.trees, self.images.files, fetcher=self.images.lazy)
        self.holder_socket = holder_socket or root / "holder.sock"
        self.mountpoint = mountpoint or root / "mnt"
        self.publisher = FusePublisher(self.images, self, root / "publishes.json")
        self.holder_process: subprocess.Popen[bytes] | None = None
        self._session: Session | None = None

    def tree_dir(self, name: str) -> Path:
        return self.mountpoint / name

    def start(self) -> None:
        client = HolderClient(self.holder_socket)
        if not client.alive():
            log.info("msg=%r socket=%s", "starting a FUSE holder", self.holder_socket)
            self.holder_process = spawn_holder(self.mountpoint, self.holder_socket)
        self._session = Session(self.ops, client)
        self._session.start()
        self.mountpoint = self._session.mountpoint
        self.images.resume_lazy()

    def healthy(self) -> bool:
        return self._session is not None and self._session.failed is None

    def stop(self) -> None:
        if self._session is not None:
            self._session.stop()
            self._session = None
