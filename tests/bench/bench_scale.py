"""Benchmark: 1,000 BundleDeployments on one manager: the time until all are Installed,
then, at rest, the manager's API requests per minute and its memory per BundleDeployment.

Where it sits: ``make bench`` (``python -m tests.bench scale``; ``RUKPAK_BENCH_SCALE=N``
for another count). On the installed system of ``bench_install`` (the local cluster,
``deploy/``), it pushes one tiny bundle per BundleDeployment (a Namespace and a ConfigMap;
pushed in-process, one layer each) and creates that many v1alpha2 BundleDeployments at
once: each is one instance run, ``--max-concurrent-runs`` (8) at a time. Once all are
Installed and the manager settled, it counts the requests the API server dispatched for
the manager's ServiceAccount over a minute (a FlowSchema of its own, as ``bench_install``)
and reads the PSS of both manager replicas.

Targets are issue 21's: at rest, watches only (requests stay those of leader election,
whatever the count: <= 30 a minute, as at 50) and <= 3 MiB per installed BundleDeployment.
The time until all are Installed has no target: it is the cluster's pod churn as much as
ours (about one pod start per BundleDeployment on a 2-core node).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import yaml

from tests import csi_helpers
from tests import install_helpers as inst
from tests.bench import Result, bench_install, progress

SCALE = int(os.environ.get("RUKPAK_BENCH_SCALE") or 1000)
INSTALL_TIMEOUT = 3600.0


def _entries(index: int) -> list[csi_helpers.Entry]:
    ns = f"bench-1k-{index}"
    docs = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "scale", "namespace": ns},
            "data": {"index": str(index)},
        },
    ]
    return [
        ("manifests/", "dir"),
        ("manifests/all.yaml", "file", yaml.safe_dump_all(docs).encode()),
    ]


def _installed_count(system: inst.RukpakSystem) -> int:
    items, _ = system.kube.list("core.rukpak.io/v1alpha2", "BundleDeployment")
    done = 0
    for bd in items:
        conds = {c.get("type"): c for c in (bd.get("status") or {}).get("conditions") or []}
        if (conds.get("Installed") or {}).get("status") == "True":
            done += 1
    return done


def measure(system: inst.RukpakSystem, workdir: Path) -> list[Result]:
    del workdir
    progress(f"scale: pushing {SCALE} bundles")
    refs = [
        csi_helpers.push_image(system.registry_host, "bench-1k/app", f"v{i}", [_entries(i)]).ref
        for i in range(SCALE)
    ]
    for key, sa in bench_install.FLOW_SCHEMAS.items():
        system.kube.apply(bench_install._flow_schema(key, sa))
    progress(f"scale: creating {SCALE} BundleDeployments")
    started = time.monotonic()
    for i, ref in enumerate(refs):
        system.kube.create(inst.bd_v2(f"bench-1k-{i}", ref))
    last_report, done = started, 0
    while done < SCALE:
        if time.monotonic() - started > INSTALL_TIMEOUT:
            raise TimeoutError(f"only {done} of {SCALE} Installed after {INSTALL_TIMEOUT:.0f}s")
        time.sleep(2.0)
        done = _installed_count(system)
        if time.monotonic() - last_report > 30:
            progress(f"scale: {done}/{SCALE} Installed after {time.monotonic() - started:.0f}s")
            last_report = time.monotonic()
    took = time.monotonic() - started
    progress(f"scale: all {SCALE} Installed in {took:.0f}s")
    time.sleep(bench_install.SETTLE_SECONDS)
    before = bench_install._dispatched(system)
    time.sleep(bench_install.AT_REST_SECONDS)
    after = bench_install._dispatched(system)
    per_minute = (after["manager"] - before["manager"]) * 60 / bench_install.AT_REST_SECONDS
    pss, rss, managers = bench_install._memory("manager")
    progress(f"scale: at rest {per_minute:.0f} req/min; managers {pss:.0f} MiB PSS x{managers}")
    return [
        Result(
            f"scale: {SCALE} v1alpha2 BundleDeployments created -> all Installed",
            took,
            "s",
            note=f"one instance run each, 8 at a time; {SCALE / took:.1f} per second",
        ),
        Result(
            f"scale: manager API requests/min at rest ({SCALE} BDs)",
            per_minute,
            "req/min",
            target=30.0,
            note="both replicas; leader election and watches only",
        ),
        Result(
            f"scale: manager memory per BundleDeployment at {SCALE} (PSS)",
            pss / SCALE,
            "MiB",
            target=3.0,
            note=f"both replicas {pss:.0f} MiB PSS ({managers} processes); RSS "
            f"{rss / SCALE:.2f} MiB/BD",
        ),
    ]


def run(workdir: Path) -> list[Result]:
    return bench_install.on_installed_system(workdir, "scale", measure)
