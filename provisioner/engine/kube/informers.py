"""A set of informers that share one client and one set of list+watch options.

Sits on ``listwatch`` (one ``Informer`` per kind followed) and under whatever
follows several kinds at once: the manager's controller and its ``healthwatch``,
the PV provisioner, drift correction, the helm provisioner (``provisioner.api``).
Each of them follows its kinds with the same stop event and watch timeout (and,
for drift correction, the same owner label and resync); ``InformerSet`` holds
those options once, makes the informers (``add``), starts them, waits for their
first lists and stops them together (or one alone, ``drop``)::

    caches = InformerSet(kube, stop=stopping, watch_timeout=60)
    bds = caches.add(API_VERSION, "BundleDeployment", on_change=...)
    pods = caches.add("v1", "Pod", namespace="rukpak-system", on_change=...)
    caches.start()
    for late in caches.wait_synced(60.0): ...   # informers whose first list is not in
    caches.stop()
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import TypedDict, Unpack

from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj
from rukpak.kube import listwatch


class Handlers(TypedDict, total=False):
    """An informer's handlers (see ``listwatch.Informer``); every key is optional."""

    on_change: Callable[[Obj], object]
    on_add: Callable[[Obj], object] | None
    on_update: Callable[[Obj, Obj], object] | None
    on_delete: Callable[[Obj], object] | None
    on_gone: Callable[[Obj, Obj], object] | None
    on_sync: Callable[[], object]


class InformerSet:
    """Informers made with the same ``kube`` and ``options``; see the module docstring."""

    def __init__(self, kube: Kube, **options: Unpack[listwatch.Options]) -> None:
        self.kube = kube
        self.options = options
        self._lock = threading.Lock()
        self._informers: list[listwatch.Informer] = []
        self._started = 0  # the first this many informers have been started

    def add(
        self,
        api_version: str,
        kind: str,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        kube: Kube | None = None,
        on_error: Callable[[str], object] | None = None,
        **handlers: Unpack[Handlers],
    ) -> listwatch.Informer:
        """A new informer of ``kind`` (not started); ``namespace`` and ``label_selector``
        override the set's, ``kube`` its client (an impersonating one: the informer sees
        what that user may see); ``on_error`` hears when following it starts failing
        (``listwatch.Options``)."""
        options = listwatch.Options(**self.options)
        if namespace is not None:
            options["namespace"] = namespace
        if label_selector is not None:
            options["label_selector"] = label_selector
        if on_error is not None:
            options["on_error"] = on_error
        informer = listwatch.Informer(kube or self.kube, api_version, kind, **handlers, **options)
        with self._lock:
            self._informers.append(informer)
        return informer

    def drop(self, informer: listwatch.Informer) -> None:
        """End ``informer`` (``Informer.end``: the set's ``stop`` is left alone) and forget
        it: the set no longer starts, waits for or stops it. One not in the set is ignored."""
        with self._lock:
            try:
                at = self._informers.index(informer)
            except ValueError:
                return
            del self._informers[at]
            if at < self._started:
                self._started -= 1
        informer.end()

    def __iter__(self) -> Iterator[listwatch.Informer]:
        with self._lock:
            return iter(list(self._informers))

    def start(self) -> None:
        """Start every informer not started yet, each on its daemon thread."""
        with self._lock:
            new = self._informers[self._started :]
            self._started = len(self._informers)
        for informer in new:
            informer.start()

    def wait_synced(self, timeout: float) -> list[listwatch.Informer]:
        """Wait up to ``timeout`` in all for the informers' first lists; those still without."""
        deadline = time.monotonic() + timeout
        return [i for i in self if not i.wait_synced(max(0.0, deadline - time.monotonic()))]

    def stop(self, timeout: float = 1.0) -> None:
        """Stop every informer and wait up to ``timeout`` for each thread to end."""
        for informer in self:
            informer.stop(timeout)
