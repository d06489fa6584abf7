"""The one ``ensure`` of the node's stores: lock per key → committed? → fetch → commit → hold.

Where it sits: below the three caches a publish asks for content — the image cache
(``rukpak.image.cache``), the git and http source cache (``rukpak.sources.cache``) and
the FUSE store (``csi.fuse.images``). Each supplies the steps that are its own (what its
key is, where it looks a committed unit up, how it fetches and commits one, what holding
it means); the order, and what runs under the key's lock, is written once here:

1. the key's lock is taken (``KeyedLocks.hold``): concurrent requests for one key fetch
   once, the later ones find the unit committed;
2. ``committed()`` looks the unit up (a cache hit; the image caches also re-check a
   private tree's credentials here, ``rukpak.image.grants``);
3. otherwise ``fetch()`` resolves, fetches (under the publish's deadline, which the
   caller's fetcher carries) and commits (``rukpak.store.commit``), returning the digest
   committed and whether it was there after all (two keys naming one content);
4. ``take(found)`` marks it used and held, still under the lock, so the collector
   (``rukpak.store.collect``) cannot see it unheld in between.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Found:
    """A committed unit: its ``digest``, and whether it was committed before (``hit``)."""

    digest: str
    hit: bool


def ensure(
    key_lock: AbstractContextManager[object],
    *,
    committed: Callable[[], str | None],
    fetch: Callable[[], Found],
    take: Callable[[Found], T],
) -> T:
    """Run the steps above for one key; returns what ``take`` returns. Idempotent as long
    as the steps are (a second call for one key is a hit)."""
    with key_lock:
        digest = committed()
        found = Found(digest, hit=True) if digest is not None else fetch()
        return take(found)
