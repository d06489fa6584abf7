"""The probes of ``spec.healthChecks``, per BundleDeployment, over the manager's caches.

Sits under the controller, beside ``healthwatch`` (which serves the installed objects
from watches): ``Probes.judge`` parses a BundleDeployment's checks once per generation
(``engine.healthchecks``; a broken check is reported, not run), keeps each check's
probe state for the install it probes (a new install starts them afresh, its initial
delays counted from when this manager first saw it), runs the probes that are due
against the cached objects and folds their verdict into ``Healthy``. Probes read caches
only: no request reaches the API server. The controller looks again when the next probe
is due.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from provisioner.engine.health import healthchecks
from provisioner.engine.health.health import Health
from provisioner.engine.objects import Obj


@dataclass
class _Probed:
    generation: int
    checks: list[healthchecks.Check]
    problems: list[str]
    install: str = ""
    installed_at: float = 0.0
    states: dict[str, healthchecks.ProbeState] = field(default_factory=dict)


class Probes:
    """Probe state of every BundleDeployment with ``spec.healthChecks``; thread-safe."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._by_bd: dict[str, _Probed] = {}

    def drop(self, name: str) -> None:
        with self._lock:
            self._by_bd.pop(name, None)

    def judge(
        self,
        name: str,
        spec: Obj,
        *,
        generation: int,
        install: str,
        objects: list[Obj] | None,
        base: Health | None,
    ) -> tuple[Health | None, float | None]:
        """``Healthy`` of BD ``name`` with its checks folded into ``base`` (the per-kind
        health of its objects), and seconds until the next probe is due.

        ``install`` names the install record (a new one restarts the probes); ``objects``
        are its cached objects (None: not known yet). Without checks, ``base`` as it is.
        """
        raw = spec.get("healthChecks")
        if not raw:
            self.drop(name)
            return base, None
        with self._lock:
            probed = self._by_bd.get(name)
            if probed is None or probed.generation != generation:
                checks, problems = healthchecks.parse(raw)
                probed = _Probed(generation, checks, problems)
                self._by_bd[name] = probed
            if probed.problems:
                more = len(probed.problems) - 1
                text = probed.problems[0] + (f" (and {more} more)" if more > 0 else "")
                return Health(False, healthchecks.message(Health(False, text))), None
            if base is None or objects is None:
                return base, None
            now = self._clock()
            if probed.install != install:
                probed.install, probed.installed_at, probed.states = install, now, {}
            checked, wait = healthchecks.step(
                probed.checks, probed.states, objects, now=now, installed_at=probed.installed_at
            )
        if not base.ready:
            return base, wait
        if not checked.ready:
            return Health(False, healthchecks.message(checked)), wait
        passed = f"{len(probed.checks)} health check(s) pass"
        return Health(True, f"{base.reason}; {passed}" if base.reason else passed), wait
