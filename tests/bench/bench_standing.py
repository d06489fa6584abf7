"""Benchmark: the standing provisioner against a pod per change, in the same run.

Where it sits: ``make bench`` (``python -m tests.bench standing``; ``RUKPAK_BENCH_SCALE=N``
sets the scale count, default 1,000; ``RUKPAK_BENCH_STANDING=scale`` runs step 4 only). On
the local cluster with ``deploy/`` installed as the end-to-end tests install it
(``bench_install.on_installed_system``):

1. **pod per change** (the baseline): a v1alpha2 ``hello`` BundleDeployment, its image
   cached on the node, created -> Installed, and -> Installed+Healthy; median of 5 after a
   warm-up round; the pods the scheduler placed in ``rukpak-system`` meanwhile are counted;
2. the same overlay without ``deploy/components/run-pods`` (the default install: the manager's
   ``--run-mode=standing`` and the ``rukpak-provisioner`` Deployment);
3. **standing**: the same rounds, plus a content change -> applied (v1 and v2 in turn), and
   the pods scheduled during all of it (target 0);
4. **scale**: N tiny BundleDeployments (a Namespace and a ConfigMap each, one image each)
   created at once -> all Installed; the same N changed at once (each to a second image)
   -> all applied; deleted at once -> all gone; the PSS of the manager replicas and the
   standing provisioner with N installed.

Targets are issue 36's: created -> Installed <= 0.5 s, -> Installed+Healthy <= 2.0 s,
change -> applied <= 0.5 s, 0 pods, N=1,000 created/changed/deleted <= 120 s each, memory
<= 223 MiB.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from provisioner.engine.objects import ObjectRef
from tests import csi_helpers
from tests import install_helpers as inst
from tests.bench import Result, bench_install, progress, timed

SCALE = int(os.environ.get("RUKPAK_BENCH_SCALE") or 1000)
SCALE_ONLY = os.environ.get("RUKPAK_BENCH_STANDING") == "scale"
"""``RUKPAK_BENCH_STANDING=scale``: the scale rounds only (about half the time)."""
ROUNDS = bench_install.ROUNDS
BD_V2 = ("core.rukpak.io/v1alpha2", "BundleDeployment")
SCALE_TIMEOUT = 1800.0


def _conds(system: inst.RukpakSystem, name: str) -> dict[str, dict[str, Any]]:
    return inst.conditions(
        system.kube.get(ObjectRef("core.rukpak.io", "v1alpha2", BD_V2[1], "", name))
    )


def _status(system: inst.RukpakSystem, name: str, *kinds: str) -> bool:
    conds = _conds(system, name)
    return all((conds.get(k) or {}).get("status") == "True" for k in kinds)


def scheduled_since(system: inst.RukpakSystem, since: float) -> int:
    """Pods the scheduler placed in rukpak-system since the wall-clock time ``since``."""
    items, _ = system.kube.list("v1", "Event", namespace=inst.NAMESPACE)
    uids: set[str] = set()
    for event in items:
        if event.get("reason") != "Scheduled":
            continue
        stamp = str(event.get("firstTimestamp") or event.get("eventTime") or "")[:19]
        try:
            at = time.mktime(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S")) - time.timezone
        except ValueError:
            continue
        if at >= since - 1:
            uids.add(str((event.get("involvedObject") or {}).get("uid")))
    return len(uids)


def rounds(system: inst.RukpakSystem, label: str, ref: str) -> tuple[list[float], list[float], int]:
    """Created -> Installed and -> Installed+Healthy, ROUNDS times after a warm-up; the
    pods scheduled during the timed rounds."""
    installed: list[float] = []
    healthy: list[float] = []
    since = 0.0
    for round_ in range(ROUNDS + 1):
        if round_ == 1:
            since = time.time()
        started = time.monotonic()
        system.kube.create(inst.bd_v2("hello", ref, installNamespace="hello"))
        bench_install._wait(
            lambda: _status(system, "hello", "Installed"), timeout=300, what="hello Installed",
            interval=0.02,
        )  # fmt: skip
        installed.append(time.monotonic() - started)
        bench_install._wait(
            lambda: _status(system, "hello", "Installed", "Healthy"), timeout=300,
            what="hello Installed+Healthy", interval=0.02,
        )  # fmt: skip
        healthy.append(time.monotonic() - started)
        progress(f"standing: {label} round {round_}: Installed {installed[-1]:.2f}s, "
                 f"+Healthy {healthy[-1]:.2f}s")  # fmt: skip
        if round_ < ROUNDS:
            _delete_hello(system)
    return installed[1:], healthy[1:], scheduled_since(system, since)


def _delete_hello(system: inst.RukpakSystem) -> None:
    inst.delete_v2(system, "hello", timeout=200)
    ns = ObjectRef("", "v1", "Namespace", "", "hello")
    bench_install._wait(lambda: system.kube.get(ns) is None, timeout=180, what="hello ns gone")


def pivots(system: inst.RukpakSystem, refs: tuple[str, str]) -> list[float]:
    took: list[float] = []
    v1, v2 = refs
    for round_ in range(ROUNDS):
        ref, greeting = (v2, bench_install.GREETING_V2) if round_ % 2 == 0 else (
            v1, bench_install.GREETING_V1)  # fmt: skip
        started = time.monotonic()
        system.kube.merge_patch(
            ObjectRef("core.rukpak.io", "v1alpha2", BD_V2[1], "", "hello"),
            {"spec": {"source": {"image": {"ref": ref}}}},
        )
        bench_install._wait(
            lambda g=greeting: bench_install._greeting(system) == g,  # type: ignore[misc]
            timeout=300, what=greeting, interval=0.02,
        )  # fmt: skip
        took.append(time.monotonic() - started)
        progress(f"standing: pivot {round_}: {took[-1]:.2f}s")
        bench_install._wait(
            lambda: _status(system, "hello", "Installed", "Healthy"), timeout=300,
            what="hello settled",
        )  # fmt: skip
    return took


def _scale_entries(index: int, version: str) -> list[csi_helpers.Entry]:
    ns = f"bench-st-{index}"
    docs = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "scale", "namespace": ns, "labels": {"bench": "standing"}},
            "data": {"version": version},
        },
    ]
    return [
        ("manifests/", "dir"),
        ("manifests/all.yaml", "file", yaml.safe_dump_all(docs).encode()),
    ]


def _count(system: inst.RukpakSystem, check: Callable[[list[dict[str, Any]]], int]) -> int:
    items, _ = system.kube.list(*BD_V2)
    return check(items)


def _installed(items: list[dict[str, Any]]) -> int:
    done = 0
    for bd in items:
        if not str(bd["metadata"]["name"]).startswith("bench-st-"):
            continue
        conds = inst.conditions(bd)
        done += (conds.get("Installed") or {}).get("status") == "True"
    return done


def _applied(system: inst.RukpakSystem, version: str) -> int:
    items, _ = system.kube.list("v1", "ConfigMap", label_selector="bench=standing")
    return sum(
        1
        for cm in items
        if str(cm["metadata"]["namespace"]).startswith("bench-st-")
        and (cm.get("data") or {}).get("version") == version
    )


def _until(what: str, count: Callable[[], int], target: int) -> float:
    started = last = time.monotonic()
    done = 0
    while done < target:
        if time.monotonic() - started > SCALE_TIMEOUT:
            raise TimeoutError(f"scale: only {done} of {target} {what} after {SCALE_TIMEOUT:.0f}s")
        time.sleep(1.0)
        done = count()
        if time.monotonic() - last > 15:
            progress(f"standing: {done}/{target} {what} after {time.monotonic() - started:.0f}s")
            last = time.monotonic()
    return time.monotonic() - started


def scale(system: inst.RukpakSystem) -> list[Result]:
    progress(f"standing: pushing {SCALE} x 2 bundles")
    refs = {
        version: [
            csi_helpers.push_image(
                system.registry_host, "bench-st/app", f"{version}-{i}", [_scale_entries(i, version)]
            ).ref
            for i in range(SCALE)
        ]
        for version in ("v1", "v2")
    }
    since = time.time()
    for i, ref in enumerate(refs["v1"]):
        system.kube.create(inst.bd_v2(f"bench-st-{i}", ref))
    created = _until("Installed", lambda: _count(system, _installed), SCALE)
    progress(f"standing: {SCALE} Installed in {created:.0f}s")
    pss, rss, managers = bench_install._memory("manager")
    ppss, prss, provisioners = bench_install._memory("standing")
    for i, ref in enumerate(refs["v2"]):
        system.kube.merge_patch(
            ObjectRef("core.rukpak.io", "v1alpha2", BD_V2[1], "", f"bench-st-{i}"),
            {"spec": {"source": {"image": {"ref": ref}}}},
        )
    changed = _until("changed", lambda: _applied(system, "v2"), SCALE)
    progress(f"standing: {SCALE} changed in {changed:.0f}s")
    for i in range(SCALE):
        system.kube.delete(ObjectRef("core.rukpak.io", "v1alpha2", BD_V2[1], "", f"bench-st-{i}"))

    def remaining() -> int:
        items, _ = system.kube.list(*BD_V2)
        return SCALE - sum(1 for bd in items if str(bd["metadata"]["name"]).startswith("bench-st-"))

    deleted = _until("deleted", remaining, SCALE)
    pods = scheduled_since(system, since)
    note = f"{SCALE} v1alpha2 BDs of 2 objects, one image each"
    return [
        Result(
            f"standing: {SCALE} BDs created at once -> all Installed",
            created,
            "s",
            target=120.0,
            note=f"{note}; {SCALE / created:.1f}/s",
        ),
        Result(
            f"standing: {SCALE} BDs changed at once -> all applied",
            changed,
            "s",
            target=120.0,
            note=note,
        ),
        Result(
            f"standing: {SCALE} BDs deleted at once -> all gone",
            deleted,
            "s",
            target=120.0,
            note=note,
        ),
        Result(
            f"standing: manager + provisioner memory at {SCALE} (PSS)",
            pss + ppss,
            "MiB",
            target=223.0,
            note=f"manager {pss:.0f} MiB x{managers} procs, provisioner "
            f"{ppss:.0f} MiB x{provisioners}; RSS {rss + prss:.0f} MiB",
        ),
        Result(f"standing: pods scheduled during the {SCALE}-BD rounds", pods, "pods", target=0.0),
    ]


def measure(system: inst.RukpakSystem, workdir: Path) -> list[Result]:
    if SCALE_ONLY:
        return scale(inst.switch_to_standing(system))
    refs = bench_install.push_hello(system, workdir, "standing-hello")
    pod_installed, pod_healthy, pod_pods = rounds(system, "pod", refs[0])
    _delete_hello(system)
    progress("standing: switching to the default install (standing provisioner)")
    system = inst.switch_to_standing(system)
    installed, healthy, pods = rounds(system, "standing", refs[0])
    since = time.time()
    changes = pivots(system, refs)
    pods += scheduled_since(system, since)
    _delete_hello(system)
    base_i = timed("", pod_installed).measured
    base_h = timed("", pod_healthy).measured
    results = [
        Result(
            "standing: created -> Installed (hello, cached)",
            timed("", installed).measured,
            "s",
            baseline=base_i,
            note=f"baseline: a pod per change; standing samples "
            f"{[round(x, 2) for x in installed]}; absolute target 0.5 s",
        ),
        Result(
            "standing: created -> Installed (absolute)",
            timed("", installed).measured,
            "s",
            target=0.5,
            note="median of 5 after a warm-up",
        ),
        Result(
            "standing: created -> Installed+Healthy (hello, cached)",
            timed("", healthy).measured,
            "s",
            baseline=base_h,
            note=f"baseline: a pod per change ({base_h:.2f}s); absolute target 2.0 s",
        ),
        Result(
            "standing: created -> Installed+Healthy (absolute)",
            timed("", healthy).measured,
            "s",
            target=2.0,
            note="median of 5 after a warm-up",
        ),
        timed("standing: content change -> applied", changes, target=0.5),
        Result(
            "standing: pods scheduled per install/upgrade",
            pods / (2 * ROUNDS),
            "pods",
            target=0.0,
            note=f"pod per change: {pod_pods / ROUNDS:.1f} per install",
        ),
    ]
    return results + scale(system)


def run(workdir: Path) -> list[Result]:
    return bench_install.on_installed_system(workdir, "standing", measure)
