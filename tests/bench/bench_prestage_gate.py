"""Benchmark: what pre-staging on by default costs a content change (the gate on vs off).

Where it sits: ``make bench`` (``python -m tests.bench prestage_gate``). On the local
single-node cluster with the default install (``deploy/``: the standing provisioner, the
node plugin following pre-stage asks, the manager's ``--prestage-timeout=120``), installed
as the end-to-end tests install it (``bench_install.on_installed_system``).

The standing bench's "content change -> applied" (a v1alpha2 ``hello`` BundleDeployment's
``spec.source`` moved between the tags v1 and v2, until the installed ConfigMap says the new
greeting), in rounds that alternate the gate off (the BundleDeployment's
``prestage.rukpak.io/timeout: "0"``) and on (the manager's default): with it on each change
is asked, the node's plugin (it serves the standing provisioner's store volume, so it needs
the content) answers, and the Node's answer wakes the held pivot. The ratio on/off of the
medians is the figure (same run, same cluster); each "on" round is checked to have asked.
"""

from __future__ import annotations

import time
from pathlib import Path

from provisioner.engine.objects import ObjectRef
from rukpak.common import prestage as words
from tests import install_helpers as inst
from tests.bench import Result, bench_install, progress, timed

ROUNDS = 6
"""Changes per mode, after one warm-up change each."""
BD = ObjectRef("core.rukpak.io", "v1alpha2", "BundleDeployment", "", "hello")


def _annotations(system: inst.RukpakSystem) -> dict[str, str]:
    live = system.kube.get(BD) or {}
    return dict((live.get("metadata") or {}).get("annotations") or {})


def _settled(system: inst.RukpakSystem) -> bool:
    conds = inst.conditions(system.kube.get(BD))
    return all((conds.get(k) or {}).get("status") == "True" for k in ("Installed", "Healthy"))


def changes(system: inst.RukpakSystem, refs: tuple[str, str]) -> tuple[list[float], list[float]]:
    """Content change -> applied with the gate off and on, alternating; warm-ups dropped."""
    off: list[float] = []
    on: list[float] = []
    v1, v2 = refs
    for round_ in range(2 * (ROUNDS + 1)):
        gate_on = round_ % 2 == 1
        timeout = None if gate_on else "0"  # None: the manager's default
        patch = {"metadata": {"annotations": {words.TIMEOUT_ANNOTATION: timeout}}}
        system.kube.merge_patch(BD, patch)
        if bench_install._greeting(system) == bench_install.GREETING_V2:  # the other one
            ref, greeting = v1, bench_install.GREETING_V1
        else:
            ref, greeting = v2, bench_install.GREETING_V2
        asked_before = _annotations(system).get(words.REQUEST_ANNOTATION)
        started = time.monotonic()
        system.kube.merge_patch(BD, {"spec": {"source": {"image": {"ref": ref}}}})
        bench_install._wait(
            lambda g=greeting: bench_install._greeting(system) == g,  # type: ignore[misc]
            timeout=300, what=greeting, interval=0.02,
        )  # fmt: skip
        took = time.monotonic() - started
        asked = _annotations(system).get(words.REQUEST_ANNOTATION)
        if gate_on and asked == asked_before:
            raise AssertionError(f"round {round_}: the gate was on but nothing was asked")
        if not gate_on and asked != asked_before:
            raise AssertionError(f"round {round_}: the gate was off but an ask was written")
        progress(f"prestage_gate: round {round_} gate {'on' if gate_on else 'off'}: {took:.2f}s")
        if round_ >= 2:
            (on if gate_on else off).append(took)
        bench_install._wait(lambda: _settled(system), timeout=300, what="hello settled")
    return off, on


def measure(system: inst.RukpakSystem, workdir: Path) -> list[Result]:
    system = inst.switch_to_standing(system)
    refs = bench_install.push_hello(system, workdir, "prestage-gate-hello")
    system.kube.create(inst.bd_v2("hello", refs[0], installNamespace="hello"))
    bench_install._wait(lambda: _settled(system), timeout=300, what="hello Installed+Healthy")
    off, on = changes(system, refs)
    base = timed("", off).measured
    return [
        timed("prestage gate off: content change -> applied", off),
        Result(
            "prestage gate on (the default): content change -> applied",
            timed("", on).measured,
            "s",
            baseline=base,
            target=1.5,
            note=f"baseline: the gate off, same run; samples {[round(x, 2) for x in on]}",
        ),
    ]


def run(workdir: Path) -> list[Result]:
    return bench_install.on_installed_system(workdir, "prestage_gate", measure)
