"""The Nodes that answer pre-stage asks, from a watch: a held pivot goes on without polling.

Sits under ``controller``, beside ``healthwatch``: an informer follows the Nodes labelled
``prestage.csi.rukpak.io/enabled=true`` (their node plugin follows asks; only those, by
label selector, so a cluster without them caches nothing), and feeds two things:

- the pre-stage ``Gate`` (``acting.prestage``) reads the Nodes from this cache, so a pivot
  costs no request (with no following Node, it goes on at once);
- a Node whose kubelet is known down (``Ready`` not ``True``) is left out: it cannot
  answer, and would hold every pivot until the timeout;
- every add, change or removal of such a Node (or of its readiness) asks the gate which
  held BundleDeployments it may release (``prestage.woken``: an answer for one of their
  images changed) and calls ``wake(name)`` for each, so the controller looks at them at
  once instead of on a timer.

The informer is not waited for at the controller's start: until its first list is in (or
if the manager may not list Nodes) the gate lists them itself, as before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from provisioner.engine.kube.informers import InformerSet
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj
from provisioner.manager.acting import prestage
from rukpak.common import prestage as words
from rukpak.kube import listwatch

SELECTOR = f"{words.ENABLED_LABEL}=true"


class NodeWatch:
    def __init__(
        self,
        kube: Kube,
        gate: prestage.Gate,
        *,
        wake: Callable[[str], None],
        stop: threading.Event,
        watch_timeout: int = 60,
    ) -> None:
        self.gate = gate
        self.wake = wake
        self._caches = InformerSet(kube, stop=stop, watch_timeout=watch_timeout)
        self.informer: listwatch.Informer = self._caches.add(
            "v1",
            "Node",
            label_selector=SELECTOR,
            on_add=lambda obj: self._changed(None, obj),
            on_update=self._changed,
            on_delete=lambda obj: None,
            on_gone=lambda cached, _last: self._changed(cached, None),
        )
        gate.follow(self.nodes)

    def start(self) -> None:
        self._caches.start()

    def nodes(self) -> list[words.NodeView] | None:
        """The following Nodes from the cache (no request); None before its first list."""
        if not self.informer.synced:
            return None
        return [words.NodeView.of(o) for o in self.informer.items() if prestage.answering(o)]

    def _changed(self, old: Obj | None, new: Obj | None) -> None:
        before = words.NodeView.of(old) if old and prestage.answering(old) else None
        after = words.NodeView.of(new) if new and prestage.answering(new) else None
        for name in self.gate.woken(before, after):
            self.wake(name)
