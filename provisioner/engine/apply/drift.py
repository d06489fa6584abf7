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
cause a write, and corrects with ``force`` (taking fields back). It names what it
corrects: the fields another writer took and that writer's field manager
(``restore.others_owning``). A writer that keeps taking them back meets the manager's
own damper (``restore.Damper``: at once, then exponential backoff within its window), and
the fight is reported once, when it becomes one (``FIGHT_THRESHOLD`` re-applies inside the
window), naming the other field manager and the fields, not on every write.

Ignore rules (``engine.ignore``, a BundleDeployment's ``spec.ignore``) hold here as in the
manager: a change only to ignored fields of a targeted object is not drift, and a
correction of other fields never takes an ignored one back from its writer.
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from provisioner.engine.apply import ignore, restore
from provisioner.engine.apply.apply import Applied
from provisioner.engine.apply.ownership import applied_fields, lost_reason
from provisioner.engine.kube.informers import InformerSet
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import OWNER_LABEL, Obj, ObjectRef, meta_of
from rukpak.common import errors
from rukpak.kube import listwatch

log = logging.getLogger(__name__)

Report = Callable[[str], None]
FIGHT_THRESHOLD = 3
"""Re-applies of one object inside the damper's window that make a fight (the manager's
figure, ``manager.plan.FIGHT_THRESHOLD``)."""


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
        rules: tuple[ignore.Rule, ...] = (),
    ) -> None:
        self._kube = kube
        self._owner = owner
        self._rules = rules
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
        self._damper = restore.Damper()
        self._clock: Callable[[], float] = time.monotonic
        self._timers: list[threading.Timer] = []
        self.corrections = 0
        """Write requests sent so far (for metrics and tests)."""
        self.fights: dict[ObjectRef, str] = {}
        """Objects in a fight now, with the report that named it (for tests and status)."""

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
        for timer in self._timers:
            timer.cancel()
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
            if self._ignorable(tracked, live):
                return
            self._pending.add(ref)
        self._queue.put(ref)

    def _ignorable(self, tracked: _Tracked, live: Obj | None) -> bool:
        """Whether the only change is to fields the ignore rules leave to other writers."""
        return bool(self._rules) and ignore.only_ignored(
            tracked.fields, tracked.desired, live=live, owner=self._owner, rules=self._rules
        )

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
            later = 0.0
            try:
                later = self._correct(ref)
            except errors.RukpakError as err:
                self._report(f"could not correct {ref}: {err}")
            finally:
                if later > 0 and not self._stop.is_set():  # stays pending until then
                    timer = threading.Timer(later, self._queue.put, args=(ref,))
                    timer.daemon = True
                    self._timers = [t for t in self._timers if t.is_alive()] + [timer]
                    timer.start()
                else:
                    with self._lock:
                        self._pending.discard(ref)

    def _correct(self, ref: ObjectRef) -> float:
        """Correct ``ref`` if it drifted; the seconds to wait first when a fight is damped
        (0: done, or nothing to do)."""
        with self._lock:
            tracked = self._tracked[ref.identity]
        live = self._kube.get(ref)
        reason = drift_reason(tracked.fields, live, self._owner)
        if reason is None or self._ignorable(tracked, live):
            self.fights.pop(ref, None)
            return 0.0
        if live is not None and meta_of(live).get("deletionTimestamp"):
            return 0.0  # being deleted: its DELETED event brings it back here
        key = "/".join(ref.identity)
        wait = self._damper.wait(key, self._clock())
        if wait > 0:
            return wait
        taken = frozenset(restore.fields_of(tracked.fields)) - frozenset(
            restore.fields_of(applied_fields(live) if live is not None else None)
        )
        writers = restore.others_owning(live, taken)
        body = tracked.desired
        if self._rules and live is not None:
            body = ignore.shape(body, live, pointers=ignore.pointers_for(self._rules, live))
        result = self._kube.apply(body, force=True)
        self.corrections += 1
        with self._lock:
            tracked.fields = applied_fields(result)
        count = self._damper.record(key, self._clock())
        named = "; ".join(f"{field} (by {manager})" for manager, field in writers)
        if count < FIGHT_THRESHOLD:
            self._report(f"corrected {ref}: {reason}" + (f": {named}" if named else ""))
        elif count == FIGHT_THRESHOLD:  # once: from now on it is damped, not reported
            who = ", ".join(sorted({m for m, _ in writers})) or "another writer"
            fields = ", ".join(sorted({f for _, f in writers})) or "fields this bundle applies"
            message = (
                f"fight over {ref}: {who} keeps changing {fields}; re-applying with "
                f"backoff (the other writer should stop, or leave these fields to it)"
            )
            self.fights[ref] = message
            self._report(message)
        return 0.0
