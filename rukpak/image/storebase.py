"""What both image stores of a node are built from, written once.

Where it sits: bind mode's cache (``rukpak.image.cache.ImageCache``) and FUSE mode's
store (``csi.fuse.images.FuseImages``) subclass :class:`ImageStoreBase`; the plugin
(``csi.plugin.main``) builds both from one :class:`~rukpak.image.settings.CacheSettings`.
What they share is taken here from the same arguments (:class:`StoreOptions`): the
registry client factory, the budgets and clock, the metrics observer, the credential
re-check table (``rukpak.image.grants``), and the two lock tables of the node's one
``ensure`` (``rukpak.store.ensure``: one per reference and platform, one per manifest
digest). Each store then adds what is its own (bind mode: the content store, unpacked
trees, holders; FUSE mode: the file store, tree indexes, tags).
"""

from __future__ import annotations

from pathlib import Path
from typing import Required, TypedDict, Unpack

from rukpak.image import extract, seams
from rukpak.image.grants import Grants
from rukpak.image.locks import KeyedLocks
from rukpak.image.settings import DEFAULTS, CacheSettings

__all__ = ["ImageStoreBase", "StoreOptions"]


class StoreOptions(TypedDict, total=False):
    """The keyword arguments every image store takes (its constructor's ``**options``)."""

    puller_factory: Required[seams.PullerFactory]
    """Builds a registry client for a pull's credentials (``None``: anonymous)."""
    settings: CacheSettings
    """Budgets, TTLs and clock (default: the plugin's, ``rukpak.image.settings.DEFAULTS``)."""
    observer: seams.Observer | None
    """The plugin's metrics (cache hits and misses, pulls, their seconds and bytes)."""


class ImageStoreBase:
    """The parts an image store is built from; a subclass adds its own layout under ``root``."""

    def __init__(
        self, root: Path, *, grants: Grants | None = None, **options: Unpack[StoreOptions]
    ) -> None:
        """``grants``: another store's credential re-check table to share (default: a new
        one with ``settings.auth_ttl``), so that both modes check a pod's credentials
        against a private image once."""
        settings = options.get("settings", DEFAULTS)
        puller_factory = options["puller_factory"]
        self.root = root
        self.settings = settings
        self._puller_factory = puller_factory
        self.grants = (
            grants if grants is not None else Grants(puller_factory, ttl=settings.auth_ttl)
        )
        self._limits = settings.limits
        self._observer: seams.Observer = options.get("observer") or seams.NoObserver()
        self._clock = settings.clock  # unix seconds: when retention was set, and how old it is
        self._ref_locks = KeyedLocks()  # one per (reference, platform): resolve and pull once
        self._digest_locks = KeyedLocks()  # one per manifest digest: two tags, one content

    @property
    def limits(self) -> extract.Limits:
        """The unpack budgets (also applied to git and http trees, ``rukpak.sources.cache``)."""
        return self._limits
