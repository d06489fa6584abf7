"""What a node's image cache may hold and how long it trusts: one record for both publish modes.

Where it sits: the plugin (``csi.plugin.main``) builds one from its flags
(``--max-unpacked-*``, ``--cache-budget``, ``--private-image-auth-ttl``,
``--retain-ttl``) and hands the same record to bind mode's cache
(``rukpak.image.cache.ImageCache``) and to FUSE mode's store
(``csi.fuse.images.FuseImages``), so both modes apply one set of budgets.
Tests build one with a fake ``clock``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rukpak.image import eviction, extract, grants

DEFAULT_BUDGET = 10 * 1024**3
"""Bytes a cache may hold before it evicts unused trees (``--cache-budget``)."""


@dataclass(frozen=True)
class CacheSettings:
    """A cache's budgets and clocks; every field has the plugin's default."""

    limits: extract.Limits = field(default_factory=extract.Limits)
    """What one image may unpack to (entries, bytes, depth)."""
    budget_bytes: int = DEFAULT_BUDGET
    """Bytes the cache may hold before unused trees are evicted."""
    auth_ttl: float = grants.DEFAULT_TTL
    """Seconds a credential's successful check against a private image is remembered."""
    retain_ttl: float = eviction.RETAIN_TTL
    """Seconds eviction spares an owner's retained trees after the publish that named them."""
    clock: Callable[[], float] = time.time
    """Unix seconds: when retention was set, and how old it is."""


DEFAULTS = CacheSettings()
"""The plugin's defaults (what a cache built without settings applies)."""
