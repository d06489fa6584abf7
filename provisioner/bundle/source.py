"""Bundle sources for off-cluster use: a local directory, or an image pulled and unpacked.

Before ``formats``: ``rukpak apply IMAGE`` needs the bundle on local disk. An
image goes through the same code the CSI node plugin uses
(``rukpak.image.cache.ImageCache``: digest-verified pull, safe extraction) into a
temporary cache that is removed afterwards. In the cluster the instance pod
never needs this: the bundle arrives as a CSI volume.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rukpak.oci.auth import Credentials


def looks_like_directory(source: str) -> bool:
    """A path that exists, or one written as a path (``./x``, ``/x``, ``~``)."""
    return Path(source).expanduser().is_dir() or source.startswith(("/", "./", "../", "~"))


@contextmanager
def local_bundle(
    source: str,
    *,
    credentials: Credentials | None = None,
    insecure: Iterable[str] = (),
    platform: str | None = None,
    timeout: float = 30.0,
) -> Iterator[Path]:
    """The bundle's root on local disk for the ``with`` block: ``source`` itself when it is a
    directory, else the unpacked tree of the image it names."""
    if looks_like_directory(source):
        yield Path(source).expanduser()
        return
    from rukpak.image import cache as images
    from rukpak.oci import client as oci_client
    from rukpak.oci.manifest import Platform

    hosts = tuple(insecure)
    workdir = Path(tempfile.mkdtemp(prefix="rukpak-bundle-"))
    try:
        cache = images.ImageCache(
            workdir,
            puller_factory=lambda creds: oci_client.RegistryClient(
                credentials=creds, insecure=hosts, timeout=timeout
            ),
        )
        unpacked = cache.ensure(
            source,
            platform=Platform.parse(platform) if platform else Platform.current(),
            pull_policy=images.PullPolicy.ALWAYS,
            credentials=credentials,
        )
        yield unpacked.path
    finally:
        _remove(workdir)


def _remove(path: Path) -> None:
    """Remove a cache dir whose trees were sealed read-only."""
    for p in [path, *path.rglob("*")]:
        if p.is_dir() and not p.is_symlink():
            p.chmod(0o700)
    shutil.rmtree(path, ignore_errors=True)
