"""Bundle content on local disk: one directory per pinned image reference or tarball URL.

Where it sits: under the controller. A Bundle's content is fetched once by its pinned
reference (``api.fetch_bundle``: digest-verified pull, safe extraction; a v1alpha2 http
source through ``api.fetch_tarball``) into
``ROOT/<hash of the reference>``; later renders (a values change) read it from there.
Content behind a pinned reference never changes, so an entry is never refreshed; a
restarted process (its cache dir is an emptyDir) fetches again on first use.
``forget`` removes the entries no Bundle pins any more.

Standing (``--store-dir``, the node plugin's store volume mounted there): images are not
pulled here at all; the tag is pinned (one manifest request) and the node plugin serves
the content by digest (``api.open_store``), read-only, cached and collected on the node
as any pod volume's.
"""

from __future__ import annotations

import hashlib
import shutil
import threading
from collections.abc import Callable, Collection, Iterable
from pathlib import Path

from provisioner import api


class Store:
    def __init__(
        self, root: Path, *, insecure: Iterable[str] = (), node_store: Path | None = None
    ) -> None:
        self.root = root
        self.insecure = tuple(insecure)
        self._lock = threading.Lock()
        self._node: api.StoreClient | None = api.open_store(node_store) if node_store else None
        root.mkdir(parents=True, exist_ok=True)

    def close(self) -> None:
        if self._node is not None:
            self._node.close()

    def path(self, pinned: str) -> Path:
        return self.root / hashlib.sha256(pinned.encode()).hexdigest()[:32]

    def fetch(self, ref: str) -> tuple[str, Path]:
        """Fetch image ``ref``, or the tarball at ``ref`` when it is an ``http(s)://`` URL (a
        tag or a bare URL is pinned first); the pinned reference or URL and its files."""
        if ref.startswith(("http://", "https://")):
            return self._fetch(ref, "#sha256=" in ref, self._tarball)
        if self._node is not None:  # standing: the node plugin serves it by digest
            pinned = api.pin_image(ref, insecure=self.insecure)
            return pinned, self._node.fetch(pinned)
        return self._fetch(ref, "@sha256:" in ref, api.fetch_bundle)

    def _tarball(self, url: str, dest: Path, *, insecure: Iterable[str] = ()) -> str:
        return api.fetch_tarball(url, dest)

    def _fetch(
        self, ref: str, pinned_already: bool, fetcher: Callable[..., str]
    ) -> tuple[str, Path]:
        with self._lock:
            if pinned_already and self.path(ref).is_dir():
                return ref, self.path(ref)
            staging = self.root / ".fetching"
            shutil.rmtree(staging, ignore_errors=True)
            pinned = str(fetcher(ref, staging, insecure=self.insecure))
            target = self.path(pinned)
            if target.is_dir():
                shutil.rmtree(staging, ignore_errors=True)
            else:
                staging.rename(target)
            return pinned, target

    def forget(self, keep: Collection[str]) -> list[Path]:
        """Remove every entry whose pinned reference is not in ``keep``; what went."""
        wanted = {self.path(ref).name for ref in keep}
        gone = []
        with self._lock:
            for entry in sorted(self.root.iterdir()):
                if entry.name not in wanted and not entry.name.startswith("."):
                    shutil.rmtree(entry, ignore_errors=True)
                    gone.append(entry)
        return gone
