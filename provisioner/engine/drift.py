"""Drift correction: watch what a deployment applied and re-apply what others change.

Runs after ``apply.install`` in the instance pod (and ``rukpak apply --watch``).
One ``listwatch.Informer`` per kind (an ``informers.InformerSet``), filtered by the
owner label, feeds a single worker.
The decision is pure (``drift_reason``): an object has drifted when it is gone,
lost its owner label, or the set of fields the ``rukpak`` manager owns
(``managedFields[manager=rukpak, operation=Apply].fieldsV1``) differs from the
set recorded right after our last apply. Another writer changing a field we
apply takes that field's ownership away, so the set changes; writers touching
only fields we do not apply leave it alone. In steady state the loop therefore
sends no write requests: events for our own applies compare equal, and a
re-list (after 410 Gone, or the periodic resync) only reads. The pieces of
that decision shared with ``apply`` (our managedFields entry, the owner
label) live in ``ownership``.

The worker re-reads an object before correcting it, so stale events never
cause a write, and corrects with ``force`` (taking fields back).
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from provisioner.engine import listwatch
from provisioner.engine.apply import Applied
from provisioner.engine.informers import InformerSet
from provisioner.engine.kube import Kube
from provisioner.engine.objects import OWNER_LABEL, Obj, ObjectRef, meta_of
from provisioner.engine.ownership import applied_fields, lost_reason
from rukpak.common import errors

log = logging.getLogger(__name__)

Report = Callable[[str], None]


def drift_reason(
    recorded: Any, live: Obj | None, owner: str, *, fields: Callable[[Obj], Any] = applied_fields
) -> str | None:
    """Why ``live`` no longer matches what we applied, or None when it still does.

    ``recorded`` is what ``fields`` gave right after our apply: the fields our manager
    owns (``ownership.applied_fields``), or a hash of them (``appliedrecord``).
    """
    lost = lost_reason(live, owner)
    if lost is not None or live is None:
        return lost or "deleted"
    if fields(live) != recorded:
        return "fields we apply were changed by another writer"
    return None


@dataclass
class _Tracked:
    desired: Obj
    fields: Any


class DriftWatcher:
    """Keeps the applied objects of deployment ``owner`` as applied, until stopped."""

    def __init__(
        self,
        kube: Kube,
        owner: str,
        applied: Iterable[Applied],
        *,
        report: Report = log.info,
        watch_timeout: int = 60,
        resync: float = 300.0,
    ) -> None:
        self._kube = kube
        self._owner = owner
        self._report = report
        self._stop = threading.Event()
        self._caches = InformerSet(
            kube,
            label_selector=f"{OWNER_LABEL}={owner}",
            stop=self._stop,
            watch_timeout=watch_timeout,
            relist_every=resync,
        )
        self._lock = threading.Lock()
        self._tracked: dict[tuple[str, str, str, str], _Tracked] = {}
        self._refs: dict[tuple[str, str, str, str], ObjectRef] = {}
        for a in applied:
            self._tracked[a.ref.identity] = _Tracked(a.manifest.obj, applied_fields(a.live))
            self._refs[a.ref.identity] = a.ref
        self._queue: queue.Queue[ObjectRef | None] = queue.Queue()
        self._pending: set[ObjectRef] = set()
        self._informers: dict[tuple[str, str], listwatch.Informer] = {}
        self._worker: threading.Thread | None = None
        self.corrections = 0
        """Write requests sent so far (for metrics and tests)."""

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> None:
        kinds = sorted({(r.api_version, r.kind) for r in self._refs.values()})
        self._informers = {
            kind: self._caches.add(
                *kind,
                on_change=self._seen,
                on_delete=self._deleted,
                on_sync=functools.partial(self._synced, kind),
            )
            for kind in kinds
        }
        self._caches.start()
        self._worker = threading.Thread(target=self._work, name="drift-worker", daemon=True)
        self._worker.start()

    def stop(self, timeout: float = 1.0) -> None:
        """Ask every thread to end; watches end at the latest when their server timeout ends."""
        self._stop.set()
        self._queue.put(None)
        self._caches.stop(timeout)
        if self._worker is not None:
            self._worker.join(timeout)

    def run(self, stop: threading.Event) -> None:
        """``start``, block until ``stop`` is set, then ``stop``."""
        self.start()
        stop.wait()
        self.stop()

    # -- what tests and metrics read ----------------------------------------------

    def informer(self, api_version: str, kind: str) -> listwatch.Informer:
        """The list+watch cache of one applied kind (``wait`` on it to know an event arrived)."""
        return self._informers[(api_version, kind)]

    @property
    def idle(self) -> bool:
        """No correction queued or running."""
        with self._lock:
            return not self._pending

    # -- watching ---------------------------------------------------------------

    def _check(self, ref: ObjectRef, live: Obj | None) -> None:
        with self._lock:
            tracked = self._tracked.get(ref.identity)
            if tracked is None or ref in self._pending:
                return
            if drift_reason(tracked.fields, live, self._owner) is None:
                return
            self._pending.add(ref)
        self._queue.put(ref)

    def _seen(self, obj: Obj) -> None:
        ref = self._refs.get(ObjectRef.of(obj).identity)
        if ref is not None:
            self._check(ref, obj)

    def _deleted(self, obj: Obj) -> None:
        ref = self._refs.get(ObjectRef.of(obj).identity)
        if ref is not None:
            self._check(ref, None)

    def _synced(self, kind: tuple[str, str]) -> None:
        """After a (re-)list: what we track of this kind and the list lacks is gone."""
        informer = self._informers[kind]
        for ref in self._refs.values():
            if (ref.api_version, ref.kind) != kind:
                continue
            if informer.get(ref.namespace, ref.name) is None:
                self._check(ref, None)

    # -- correcting ---------------------------------------------------------------

    def _work(self) -> None:
        while True:
            ref = self._queue.get()
            if ref is None or self._stop.is_set():
                return
            try:
                self._correct(ref)
            except errors.RukpakError as err:
                self._report(f"could not correct {ref}: {err}")
            finally:
                with self._lock:
                    self._pending.discard(ref)

    def _correct(self, ref: ObjectRef) -> None:
        with self._lock:
            tracked = self._tracked[ref.identity]
        live = self._kube.get(ref)
        reason = drift_reason(tracked.fields, live, self._owner)
        if reason is None:
            return
        if live is not None and meta_of(live).get("deletionTimestamp"):
            return  # being deleted: its DELETED event brings it back here
        result = self._kube.apply(tracked.desired, force=True)
        self.corrections += 1
        with self._lock:
            tracked.fields = applied_fields(result)
        self._report(f"corrected {ref}: {reason}")
