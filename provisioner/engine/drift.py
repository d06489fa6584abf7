"""Drift correction: watch what a deployment applied and re-apply what others change.

Runs after ``apply.install`` in the instance pod (and ``rukpak apply --watch``).
One list+watch per kind, filtered by the owner label, feeds a single worker.
The decision is pure (``drift_reason``): an object has drifted when it is gone,
lost its owner label, or the set of fields the ``rukpak`` manager owns
(``managedFields[manager=rukpak, operation=Apply].fieldsV1``) differs from the
set recorded right after our last apply. Another writer changing a field we
apply takes that field's ownership away, so the set changes; writers touching
only fields we do not apply leave it alone. In steady state the loop therefore
sends no write requests: events for our own applies compare equal, and a
re-list (after 410 Gone, or the periodic resync) only reads. The pieces of
that decision shared with ``apply`` (our managedFields entry, the owner
label) live in ``managed``.

The worker re-reads an object before correcting it, so stale events never
cause a write, and corrects with ``force`` (taking fields back).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from csi.common import errors
from provisioner.engine.apply import Applied
from provisioner.engine.errors import Gone
from provisioner.engine.kube import Kube
from provisioner.engine.objects import OWNER_LABEL, Obj, ObjectRef
from provisioner.engine.ownership import applied_fields, lost_reason

log = logging.getLogger(__name__)

Report = Callable[[str], None]


def drift_reason(recorded: Any, live: Obj | None, owner: str) -> str | None:
    """Why ``live`` no longer matches what we applied, or None when it still does."""
    lost = lost_reason(live, owner)
    if lost is not None or live is None:
        return lost or "deleted"
    if applied_fields(live) != recorded:
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
        self._watch_timeout = watch_timeout
        self._resync = resync
        self._lock = threading.Lock()
        self._tracked: dict[tuple[str, str, str, str], _Tracked] = {}
        self._refs: dict[tuple[str, str, str, str], ObjectRef] = {}
        for a in applied:
            self._tracked[a.ref.identity] = _Tracked(a.manifest.obj, applied_fields(a.live))
            self._refs[a.ref.identity] = a.ref
        self._queue: queue.Queue[ObjectRef | None] = queue.Queue()
        self._pending: set[ObjectRef] = set()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.corrections = 0
        """Write requests sent so far (for metrics and tests)."""

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> None:
        kinds = sorted({(r.api_version, r.kind) for r in self._refs.values()})
        self._threads = [
            threading.Thread(
                target=self._watch_kind, args=kind, name=f"drift-{kind[1]}", daemon=True
            )
            for kind in kinds
        ]
        self._threads.append(threading.Thread(target=self._work, name="drift-worker", daemon=True))
        for t in self._threads:
            t.start()

    def stop(self, timeout: float = 1.0) -> None:
        """Ask every thread to end; watches end at the latest when their server timeout ends."""
        self._stop.set()
        self._queue.put(None)
        for t in self._threads:
            t.join(timeout)

    def run(self, stop: threading.Event) -> None:
        """``start``, block until ``stop`` is set, then ``stop``."""
        self.start()
        stop.wait()
        self.stop()

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

    def _relist(self, api_version: str, kind: str) -> str:
        items, rv = self._kube.list(api_version, kind, label_selector=self._selector())
        seen = {ObjectRef.of(i).identity: i for i in items}
        for identity, ref in list(self._refs.items()):
            if (ref.api_version, ref.kind) == (api_version, kind):
                self._check(ref, seen.get(identity))
        return rv

    def _selector(self) -> str:
        return f"{OWNER_LABEL}={self._owner}"

    def _watch_kind(self, api_version: str, kind: str) -> None:
        backoff = 0.5
        rv = ""
        listed_at = 0.0
        while not self._stop.is_set():
            try:
                if not rv or time.monotonic() - listed_at > self._resync:
                    rv = self._relist(api_version, kind)
                    listed_at = time.monotonic()
                for event_type, obj in self._kube.watch(
                    api_version,
                    kind,
                    resource_version=rv,
                    label_selector=self._selector(),
                    timeout_seconds=self._watch_timeout,
                ):
                    if self._stop.is_set():
                        return
                    rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                    if event_type == "BOOKMARK":
                        continue
                    obj.setdefault("apiVersion", api_version)
                    obj.setdefault("kind", kind)
                    ref = self._refs.get(ObjectRef.of(obj).identity)
                    if ref is not None:
                        self._check(ref, None if event_type == "DELETED" else obj)
                backoff = 0.5
            except Gone:
                rv = ""  # too old: re-list
            except errors.RukpakError as err:
                self._report(f"watch {kind} failed, retrying in {backoff:.1f}s: {err}")
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)
                rv = ""

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
        if live is not None and (live.get("metadata") or {}).get("deletionTimestamp"):
            return  # being deleted: its DELETED event brings it back here
        result = self._kube.apply(tracked.desired, force=True)
        self.corrections += 1
        with self._lock:
            tracked.fields = applied_fields(result)
        self._report(f"corrected {ref}: {reason}")
