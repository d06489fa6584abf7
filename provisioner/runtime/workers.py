"""Workers: the threads that drain a ``WorkQueue`` into a controller's reconcile.

Sits between ``queue`` (keys, dedup, delays, backoff) and the reconcile of a
controller: the manager's (``manager.controller``), the PV provisioner's
(``storage.controller``) and, through ``provisioner.api``, the helm
provisioner's. Each worker takes a key and calls ``reconcile(key)``:

- it returns None: the key is settled, its failures are forgotten;
- it returns a delay: the key is looked at again after it (its failures are
  forgotten first, unless ``keep_failures_on_requeue``: then the reconcile asks
  for its own retries with ``queue.retry`` and the backoff keeps growing until it
  returns None);
- it raises a ``RukpakError`` (temporary: the API server, a registry) or any
  other exception (a bug; the worker stays alive): the key is retried after its
  backoff and the log says why.

A key is on one worker at a time (the queue sees to that). ``spawn`` also runs a
controller's other loops (resync, extra watches) as named daemon threads, so
``stop`` ends them all: it sets the stop event, shuts the queue down and joins.

``Reconciler`` is the frame those controllers share: informers
(``engine.informers.InformerSet``, ``caches``) that feed keys into the queue,
``workers`` that drain it, one stop event for both.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from provisioner.engine.kube.informers import InformerSet
from provisioner.engine.kube.kube import Kube
from provisioner.runtime.metrics import Metrics, classify, since
from provisioner.runtime.queue import WorkQueue
from rukpak.common import errors

Reconcile = Callable[[str], float | None]
"""One pass over a key; the delay after which to look at it again, if any."""


class Workers:
    """Threads draining ``queue`` into ``reconcile`` until ``stopping`` is set."""

    def __init__(
        self,
        queue: WorkQueue,
        reconcile: Reconcile,
        *,
        log: logging.Logger,
        stopping: threading.Event | None = None,
        what: str = "reconcile",
        keep_failures_on_requeue: bool = False,
        metrics: Metrics | None = None,
        controller_of: Callable[[str], str] = lambda key: "",
        controllers: tuple[str, ...] = ("",),
    ) -> None:
        self.queue = queue
        self.metrics = metrics
        self.controllers = controllers
        """Every ``controller`` label ``controller_of`` gives (for the concurrency gauge)."""
        self.controller_of = controller_of
        """The ``controller`` label of a key's reconcile (the manager's keys name their kind)."""
        self.stopping = stopping or threading.Event()
        self._reconcile = reconcile
        self._log = log
        self._what = what  # names the pass in the logs: "reconcile failed", "sync crashed"
        self._keep_failures = keep_failures_on_requeue
        self._threads: list[tuple[threading.Thread, bool]] = []

    def start(self, count: int) -> None:
        """``count`` workers, named ``worker-0`` and up."""
        if self.metrics is not None:
            for controller in self.controllers:
                self.metrics.max_concurrent.labels(controller).set(count)
        for i in range(count):
            self.spawn(f"worker-{i}", self.work)

    def spawn(self, name: str, target: Callable[[], object], *, join: bool = True) -> None:
        """Run ``target`` on a daemon thread; ``stop`` joins it unless ``join`` is False
        (a loop that ends only with its watch, up to a server timeout later)."""
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append((thread, join))

    def stop(self, timeout: float = 5.0) -> None:
        self.stopping.set()
        self.queue.shutdown()
        for thread, join in self._threads:
            if join:
                thread.join(timeout=timeout)

    def work(self) -> None:
        """One worker's loop (``start`` runs it on threads; tests may call it directly)."""
        while not self.stopping.is_set():
            key = self.queue.get(timeout=1.0)
            if key is None:
                continue
            started = time.monotonic()
            result = "error"
            try:
                after = self._reconcile(key)
                result = classify(after)
            except errors.RukpakError as err:
                delay = self.queue.retry(key)
                self._log.warning(
                    "msg='%s failed' key=%s retry_in=%.1fs error=%r",
                    self._what,
                    key,
                    delay,
                    err.message,
                )
            except Exception:  # a bug: keep the worker alive, retry with backoff
                delay = self.queue.retry(key)
                self._log.exception(
                    "msg='%s crashed' key=%s retry_in=%.1fs", self._what, key, delay
                )
            else:
                if after is None or not self._keep_failures:
                    self.queue.forget(key)
                if after is not None:
                    self.queue.add_after(key, after)
            finally:
                if self.metrics is not None:
                    self.metrics.reconciled(self.controller_of(key), result, since(started))
                self.queue.done(key)


class Reconciler:
    """A controller's frame: ``caches`` feed ``queue``; ``workers`` drain it into
    ``reconcile``. Subclasses add their informers (``self.caches.add``) and start them,
    the workers and their other loops (``self.workers.spawn``)."""

    def __init__(
        self,
        kube: Kube,
        queue: WorkQueue,
        reconcile: Reconcile,
        *,
        log: logging.Logger,
        watch_timeout: int = 60,
        what: str = "reconcile",
        keep_failures_on_requeue: bool = False,
        metrics: Metrics | None = None,
        controller_of: Callable[[str], str] = lambda key: "",
        controllers: tuple[str, ...] = ("",),
        queue_name: str = "",
    ) -> None:
        self.kube = kube
        self.queue = queue
        self.metrics = metrics
        if metrics is not None:
            queue.observer = metrics.queue(queue_name, lambda: len(queue))
        self.workers = Workers(
            queue,
            reconcile,
            log=log,
            what=what,
            keep_failures_on_requeue=keep_failures_on_requeue,
            metrics=metrics,
            controller_of=controller_of,
            controllers=controllers,
        )
        self.stopping = self.workers.stopping
        self.caches = InformerSet(kube, stop=self.stopping, watch_timeout=watch_timeout)
