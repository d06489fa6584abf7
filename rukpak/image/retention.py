"""Retention tables: which trees an owner keeps from eviction, and since when.

Where it sits: below both tree stores of a node. The bind cache keeps its table inside
``state.json`` (``rukpak.image.cachestate``), the FUSE store in a file of its own
(``csi.fuse.images``); both hand the table here, under their own lock, and persist it
themselves. A table maps an owner key (``retainFor``, e.g.
``bundledeployment/<name>/<uid>``) to ``{"digests": [...], "at": <unix seconds>}``:
the trees its kept revisions name, as of the publish that last set them. An entry
older than the store's TTL no longer counts, so an owner that is gone lets go by
itself. Entries that do not have this shape (a file written by hand, or damaged) count
for nothing and are dropped by the next expiry.
"""

from __future__ import annotations

from collections.abc import Collection
from enum import Enum
from typing import Any

from rukpak.oci import digest as digests

Table = dict[str, Any]
REFRESH_AFTER = 60.0
"""Seconds an unchanged entry's time stays as it is: every publish names the owner's
trees again, but only the first in a minute moves the time (and costs a write); against
a TTL of days that loses nothing."""


class Change(Enum):
    """What :func:`set_owner` changed: how urgently the table must be written."""

    NONE = "none"
    TIME = "time"  # only the time moved: losing it shortens the hold a little
    DIGESTS = "digests"


def set_owner(table: Table, owner: str, tree_digests: Collection[str], now: float) -> Change:
    """Make ``tree_digests`` the trees ``owner`` retains as of ``now``, replacing what it
    retained; an empty collection ends the owner's retention. Invalid digests are dropped.
    The same trees named again within ``REFRESH_AFTER`` seconds change nothing."""
    kept = sorted({d for d in tree_digests if digests.is_valid(d)})
    before = table.get(owner)
    if not kept:
        return Change.NONE if table.pop(owner, None) is None else Change.DIGESTS
    same = isinstance(before, dict) and before.get("digests") == kept
    if same and _fresh(before, now, REFRESH_AFTER):
        return Change.NONE
    table[owner] = {"digests": kept, "at": now}
    return Change.TIME if same else Change.DIGESTS


def fresh(table: Table, now: float, ttl: float) -> set[str]:
    """Hex digests of the trees retained by entries at most ``ttl`` seconds older than
    ``now``."""
    return {
        digests.hex_of(d)
        for entry in table.values()
        if _fresh(entry, now, ttl)
        for d in digests_of(entry)
    }


def expire(table: Table, now: float, ttl: float) -> list[str]:
    """Drop the entries more than ``ttl`` seconds older than ``now`` (and malformed ones);
    returns their owners, sorted."""
    gone = sorted(owner for owner, entry in table.items() if not _fresh(entry, now, ttl))
    for owner in gone:
        del table[owner]
    return gone


def digests_of(entry: object) -> list[str]:
    """The valid digests of one entry."""
    found = entry.get("digests") if isinstance(entry, dict) else None
    items = found if isinstance(found, list) else []
    return [d for d in items if isinstance(d, str) and digests.is_valid(d)]


def _fresh(entry: object, now: float, ttl: float) -> bool:
    at = entry.get("at") if isinstance(entry, dict) else None
    return isinstance(at, int | float) and not isinstance(at, bool) and now - at <= ttl
