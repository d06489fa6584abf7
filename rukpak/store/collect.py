"""The one collector of the node's stores: over budget, the least recently used units no
holder holds and no owner retains go.

Where it sits: below the image cache's eviction (``rukpak.image.eviction``: a unit is an
unpacked tree with its blobs) and the FUSE store's collection (``csi.fuse.collect``: a
unit is a tree index with the files only it names). Each hands this module a
:class:`Backend` saying what a unit is, its last use, what the store uses in all, how
to take a unit away; the policy is written once here:

* nothing happens while the store's usage is within its budget (read at each pass);
* units go least recently used first, skipping every unit a holder holds (the node's
  holder registry, ``rukpak.store.holders``), an owner retains (within the retention
  TTL: a BundleDeployment's kept revisions) or the backend says is busy (a pull leases
  it, it was used a moment ago), until the usage left is within the budget;
* victims are picked and detached under the backend's lock (the one its holds are
  staged under, so a unit is held before the collector can see it unheld), and removed
  for good after it is released (:meth:`Backend.finish`: slow deletions, files no unit
  names any more);
* one pass at a time; :meth:`Collector.request` runs one in a background thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Collection, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from rukpak.common.background import Chore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Unit:
    """What the collector may remove: ``name`` (a tree's hex digest), last used at
    ``last_used`` (any clock the backend keeps; only the order counts)."""

    name: str
    last_used: float


class Backend(Protocol):
    """One store as the collector sees it. Methods named "under the lock" run inside
    :meth:`locked`; a pass calls them in this order: usage, held, retained, units, then
    per victim busy, detach, remaining; settle; finish (after the lock)."""

    def locked(self) -> AbstractContextManager[object]:
        """The lock victims are picked under (the one holds are staged under)."""
        ...

    def usage(self) -> int:
        """Bytes the store uses now (under the lock)."""
        ...

    def held(self) -> set[str]:
        """Names of the units a holder holds (under the lock)."""
        ...

    def retained(self) -> set[str]:
        """Names of the units an owner retains within the TTL (under the lock)."""
        ...

    def units(self) -> Iterable[Unit]:
        """Every unit the store keeps (under the lock)."""
        ...

    def busy(self, unit: Unit) -> bool:
        """Whether ``unit`` must stay for now (a pull leases it, just used)."""
        ...

    def detach(self, unit: Unit) -> None:
        """Make ``unit`` unreachable, fast (under the lock): nobody finds it afterwards."""
        ...

    def remaining(self) -> int:
        """Bytes the store will use once the units detached in this pass are gone."""
        ...

    def settle(self) -> None:
        """Record the pass's detachments (under the lock, after the last pick)."""
        ...

    def finish(self, evicted: list[str]) -> None:
        """Remove what the pass detached and what no unit names any more (after the
        lock); called on every pass, also when nothing was evicted."""
        ...


class Collector:
    """Keeps one store within its budget; at most one pass runs at a time."""

    def __init__(self, backend: Backend, *, budget: Callable[[], int], name: str) -> None:
        """``budget``: the store's byte budget, read at each pass (it may change)."""
        self.backend = backend
        self.budget = budget
        self._pass_lock = threading.Lock()
        self._chore = Chore(name, self.collect, failure=f"{name}: collection failed")

    def request(self) -> None:
        """Collect in the background, outside every publish (one thread at most)."""
        self._chore.wake()

    def collect(self, *, keep: Collection[str] = ()) -> list[str]:
        """One pass (see the module docstring); ``keep`` names units spared this time.
        Returns the names of the units evicted, least recently used first."""
        with self._pass_lock:  # one pass at a time; publishes never wait for it
            evicted: list[str] = []
            b = self.backend
            with b.locked():
                budget = self.budget()
                if b.usage() > budget:
                    spared = b.held() | b.retained() | set(keep)
                    for unit in sorted(b.units(), key=lambda u: (u.last_used, u.name)):
                        if unit.name in spared or b.busy(unit):
                            continue
                        b.detach(unit)
                        evicted.append(unit.name)
                        if b.remaining() <= budget:
                            break
                    b.settle()
            b.finish(evicted)
            return evicted
