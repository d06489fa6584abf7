"""A Lease lock (``coordination.k8s.io/v1``) so two instance pods never apply at once.

Where it sits: ``provisioner.instance.process`` takes the per-deployment Lease
``rukpak-instance-NAME`` before applying and keeps it renewed until its run
ends; a second run of the same deployment (a retry racing a slow one) then
waits instead of fighting over the same objects. The ``kubernetes`` client's
``leaderelection`` module is unusable here (it blocks forever, exits the
process on errors and never releases), hence this small one.

The decision is pure (``should_take``): a Lease is free when it has no
holder, when we hold it already, or when its record has not changed for longer
than its duration since *this process* observed it change (client-go's rule:
expiry is judged by the observer's own monotonic clock, never by comparing the
writer's ``renewTime`` with ours, so clocks out of step cannot hand a Lease over
early). A holder stops using a Lease it could not renew for ``renew_deadline``
(two thirds of the duration, client-go's 10 s of 15 s), before any observer can
judge it expired.
Every write carries the resourceVersion that decision was made on, so of two
contenders that saw the same free Lease exactly one wins (the other gets a
409 and looks again). Talking to the API goes through ``Kube``: ``get`` and
``merge_patch`` (whose ``metadata.resourceVersion`` is a precondition) and
``create``.

The same lock serves leader election among a process's replicas (``leader``:
the manager, the PV provisioner, the helm provisioner).

Lifecycle: ``acquire`` (blocks until taken, a timeout, or a stop event),
``start_renewing`` (a background thread renews every ``renew_interval``),
``release`` (clears the holder so the next contender takes it at once). When
a renewal finds another holder, or renewals fail until the Lease would have
expired, the lock is lost: ``lost`` is set and ``on_lost`` is called once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef, meta_of
from rukpak.common import errors

log = logging.getLogger(__name__)

API_VERSION = "coordination.k8s.io/v1"
KIND = "Lease"
_MICROTIME = "%Y-%m-%dT%H:%M:%S.%fZ"


def lease_name(deployment: str) -> str:
    """The Lease of the instance pods of deployment ``deployment``."""
    return f"rukpak-instance-{deployment}"


def format_time(t: datetime) -> str:
    """A ``MicroTime`` as the API server stores it."""
    return t.astimezone(UTC).strftime(_MICROTIME)


def parse_time(value: Any) -> datetime | None:
    if not value:
        return None
    text = str(value).replace("Z", "+00:00")
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class LeaseRecord:
    """What the decision needs of a live Lease."""

    holder: str
    duration: float
    renewed: datetime | None
    transitions: int
    resource_version: str

    @classmethod
    def of(cls, obj: Obj) -> LeaseRecord:
        spec = obj.get("spec") or {}
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            duration=float(spec.get("leaseDurationSeconds") or 0),
            renewed=parse_time(spec.get("renewTime") or spec.get("acquireTime")),
            transitions=int(spec.get("leaseTransitions") or 0),
            resource_version=str(meta_of(obj).get("resourceVersion") or ""),
        )

    def expires(self) -> datetime | None:
        return None if self.renewed is None else self.renewed + timedelta(seconds=self.duration)


def should_take(
    lease: LeaseRecord | None, identity: str, *, observed_at: float, now: float
) -> bool:
    """Whether ``identity`` may take ``lease`` (None: no Lease exists yet) at ``now``, when
    this process last saw its record change at ``observed_at`` (both monotonic seconds)."""
    if lease is None or not lease.holder or lease.holder == identity:
        return True
    return now >= observed_at + lease.duration


def _now() -> datetime:
    return datetime.now(UTC)


class LeaseLock:
    """One contender for one Lease; ``acquire``, ``start_renewing``, ``release``."""

    def __init__(
        self,
        kube: Kube,
        *,
        namespace: str,
        name: str,
        identity: str,
        duration: float = 15.0,
        renew_interval: float | None = None,
        retry_interval: float | None = None,
        renew_deadline: float | None = None,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        if duration < 1:
            raise errors.InvalidArgument(f"lease duration must be at least 1s, not {duration}")
        if not identity:
            raise errors.InvalidArgument("a lease holder needs a non-empty identity")
        self._kube = kube
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.duration = duration
        self.renew_interval = renew_interval or duration / 3
        self.retry_interval = retry_interval or min(2.0, duration / 5)
        self.renew_deadline = renew_deadline or duration * 2 / 3
        """A holder that could not renew for this long stops (client-go's RenewDeadline)."""
        self._observed: tuple[tuple[str, str, int, float], float] | None = None
        """The Lease record last seen (holder, renewTime, transitions, duration) and the
        monotonic time this process first saw it so: where expiry counts from."""
        self._on_lost = on_lost
        self.lost = threading.Event()
        """Set once the lock is lost; whoever applied under it must stop."""
        self._held = False
        self._rv = ""
        self._renewed_at = 0.0  # monotonic time of the last successful write
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._mutex = threading.Lock()

    @property
    def ref(self) -> ObjectRef:
        return ObjectRef("coordination.k8s.io", "v1", KIND, self.namespace, self.name)

    @property
    def held(self) -> bool:
        return self._held and not self.lost.is_set()

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    # -- the API ------------------------------------------------------------------

    def _read(self) -> LeaseRecord | None:
        live = self._kube.get(self.ref)
        return None if live is None else LeaseRecord.of(live)

    def _spec(self, *, acquired: bool, transitions: int) -> dict[str, Any]:
        now = format_time(_now())
        spec: dict[str, Any] = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": round(self.duration),
            "renewTime": now,
        }
        if acquired:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = transitions
        return spec

    def _create(self) -> Obj:
        body = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {
                "name": self.name,
                "namespace": self.namespace,
                "labels": {"app.kubernetes.io/managed-by": "rukpak"},
            },
            "spec": self._spec(acquired=True, transitions=0),
        }
        try:
            return self._kube.create(body)
        except errors.NotFound:  # the namespace itself is missing
            self._kube.apply(
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": self.namespace}}
            )
            return self._kube.create(body)

    def _write(self, spec: dict[str, Any], resource_version: str) -> Obj:
        """Patch ``spec`` if the Lease is still at ``resource_version`` (else ``Aborted``)."""
        return self._kube.merge_patch(
            self.ref, {"metadata": {"resourceVersion": resource_version}, "spec": spec}
        )

    def _took(self, live: Obj) -> None:
        self._rv = str(meta_of(live).get("resourceVersion") or "")
        self._renewed_at = time.monotonic()

    # -- acquire ------------------------------------------------------------------

    def _observe(self, current: LeaseRecord | None, now: float) -> float:
        """When this process first saw ``current``'s record as it is now."""
        if current is None:
            self._observed = None
            return now
        key = (current.holder, str(current.renewed), current.transitions, current.duration)
        if self._observed is None or self._observed[0] != key:
            self._observed = (key, now)
        return self._observed[1]

    def try_acquire(self) -> bool:
        """One attempt: take the Lease if it is free; True when we hold it now."""
        with self._mutex:
            current = self._read()
            now = time.monotonic()
            observed_at = self._observe(current, now)
            if not should_take(current, self.identity, observed_at=observed_at, now=now):
                return False
            try:
                if current is None:
                    live = self._create()
                else:
                    handover = current.holder != self.identity
                    spec = self._spec(
                        acquired=handover,
                        transitions=current.transitions + 1,
                    )
                    live = self._write(spec, current.resource_version)
            except (errors.AlreadyExists, errors.Aborted):
                return False  # another contender wrote first: look again
            self._took(live)
            self._held = True
            self.lost.clear()
            return True

    def holder(self) -> str:
        """Who holds the Lease now ("" when nobody)."""
        current = self._read()
        return current.holder if current else ""

    def acquire(
        self,
        *,
        timeout: float | None = None,
        stop: threading.Event | None = None,
        waiting: Callable[[str], None] | None = None,
    ) -> bool:
        """Block until we hold the Lease (True), or ``timeout`` passes or ``stop`` is set (False).

        ``waiting`` is told the current holder each time an attempt finds the
        Lease taken (for progress logs). API errors are retried until the timeout.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        told = ""
        while True:
            try:
                if self.try_acquire():
                    return True
                if waiting is not None:
                    current = self.holder()
                    if current != told:
                        waiting(current)
                        told = current
            except errors.RukpakError as err:
                log.warning("msg='lease attempt failed' lease=%s error=%r", self, err.message)
            pause = self.retry_interval
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                pause = min(pause, left)
            if stop is not None:
                if stop.wait(pause):
                    return False
            else:
                time.sleep(pause)

    # -- renew --------------------------------------------------------------------

    def renew(self) -> bool:
        """One renewal; False (and the lock lost) when another holder has the Lease.

        Raises the API error of a failed attempt, leaving the lock held; the
        renewing thread gives up only when the Lease would have expired.
        """
        with self._mutex:
            if not self._held or self.lost.is_set():
                return False
            try:
                live = self._write(self._spec(acquired=False, transitions=0), self._rv)
            except errors.Aborted:  # changed since our last write: whose is it now?
                current = self._read()
                if current is None or current.holder != self.identity:
                    self._lose(f"taken by {current.holder!r}" if current else "deleted")
                    return False
                live = self._write(
                    self._spec(acquired=False, transitions=0), current.resource_version
                )
            except errors.NotFound:
                self._lose("deleted")
                return False
            self._took(live)
            return True

    def _lose(self, why: str) -> None:
        if self.lost.is_set():
            return
        self._held = False
        self.lost.set()
        log.warning("msg='lease lost' lease=%s identity=%s reason=%r", self, self.identity, why)
        if self._on_lost is not None:
            self._on_lost(why)

    def start_renewing(self) -> None:
        """Renew every ``renew_interval`` in a daemon thread until ``release`` (or loss)."""
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, name="lease-renew", daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.renew_interval):
            try:
                if not self.renew():
                    return
            except errors.RukpakError as err:
                silent = time.monotonic() - self._renewed_at
                log.warning(
                    "msg='lease renewal failed' lease=%s silent_for=%.1fs error=%r",
                    self,
                    silent,
                    err.message,
                )
                # give up by the renew deadline, well before anyone may judge it expired
                if silent + self.retry_interval >= self.renew_deadline:
                    with self._mutex:
                        self._lose(f"not renewed for {silent:.1f}s: {err.message}")
                    return
                self._stop.wait(self.retry_interval)

    # -- release ------------------------------------------------------------------

    def release(self) -> bool:
        """Stop renewing and clear the holder if it is still us; True when released.

        Idempotent: releasing a lock not held (or lost) does nothing.
        """
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        with self._mutex:
            if not self._held:
                return False
            self._held = False
            current = self._read()
            if current is None or current.holder != self.identity:
                return False
            spec = {
                "holderIdentity": "",
                "leaseDurationSeconds": 1,
                "renewTime": format_time(_now()),
            }
            try:
                self._write(spec, current.resource_version)
            except errors.RukpakError as err:
                log.warning("msg='lease release failed' lease=%s error=%r", self, err.message)
                return False
            return True
