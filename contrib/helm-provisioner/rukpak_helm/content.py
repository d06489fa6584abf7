"""Bundle content on local disk: one directory per pinned image reference.

Where it sits: under the controller. A Bundle's content is fetched once by its pinned
reference (``api.fetch_bundle``: digest-verified pull, safe extraction) into
``ROOT/<hash of the reference>``; later renders (a values change) read it from there.
Content behind a pinned reference never changes, so an entry is never refreshed; a
restarted process (its cache dir is an emptyDir) fetches again on first use.
``forget`` removes the entries no Bundle pins any more.
"""

from __future__ import annotations

import hashlib
import shutil
import threading
from collections.abc import Collection, Iterable
from pathlib import Path

from provisioner import api


class Store:
    def __init__(self, root: Path, *, insecure: Iterable[str] = ()) -> None:
        self.root = root
        self.insecure = tuple(insecure)
        self._lock = threading.Lock()
        root.mkdir(parents=True, exist_ok=True)

    def path(self, pinned: str) -> Path:
        return self.root / hashlib.sha256(pinned.encode()).hexdigest()[:32]

    def fetch(self, ref: str) -> tuple[str, Path]:
        """Fetch ``ref`` (a tag is pinned first); the pinned reference and its files."""
        with self._lock:
            if "@sha256:" in ref and self.path(ref).is_dir():
                return ref, self.path(ref)
            staging = self.root / ".fetching"
            shutil.rmtree(staging, ignore_errors=True)
            pinned = api.fetch_bundle(ref, staging, insecure=self.insecure)
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
