"""Benchmark: another writer's change -> the ``Drifted`` event naming it.

Where it sits: a module of ``tests.bench`` (``python -m tests.bench drift``). It starts
etcd + kube-apiserver in the work dir (``bench_apply.start_cluster``, stopped by pid),
installs the CRDs and runs the manager's controller in this process with
``tests.manager_harness``, as ``tests/test_drift_author.py`` does (no kubelet: the benchmark
plays each instance run, installing with the apply engine and leaving the record the run
would). Per round, on a
BundleDeployment of its own (the same one twice would be damped on purpose): a field
manager ``kubectl-edit`` changes a field of an installed ConfigMap by server-side apply;
timed until the BundleDeployment's ``DriftCorrected`` event is listed (the events are
polled every 10 ms). Median of ``ROUNDS``; target 1 s (issue 39).
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from provisioner.engine.apply import apply
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import condition
from provisioner.manager.acting import actuate
from tests import manager_harness as harness
from tests.bench import Result, progress, timed
from tests.bench.bench_apply import start_cluster
from tests.bundles import configmap, namespace, write_bundle
from tests.crd_helpers import install_crds
from tests.install_helpers import bd_v2
from tests.plan_helpers import as_is
from tests.polling import until

ROUNDS = 5
SYSTEM_NS = "rukpak-bench-drift"
IMAGE = "registry.example/bench/drift@sha256:" + "0" * 64
"""Pinned by digest: the manager's resolver returns it as is (no registry here)."""


def _install(kube: Kube, workdir: Path, name: str) -> None:
    """A v1alpha2 BundleDeployment of a Namespace and a ConfigMap, its run played."""
    kube.create(bd_v2(name, IMAGE, installNamespace=name))
    run = until(
        lambda: next(iter(harness.pods_of(kube, SYSTEM_NS, name)), None),
        timeout=60,
        what=f"the run of {name}",
    )
    bundle = write_bundle(
        workdir / name, {"00.yaml": [namespace(name), configmap("cfg", name, mode="ours")]}
    )
    options = apply.Options(name=name, namespace=name, system_namespace=SYSTEM_NS)
    harness.play_run(kube, run, bundle, options)

    def installed() -> bool:
        live = kube.get(actuate.bd_ref(name)) or {}
        cond = condition(live, "Installed")
        return cond is not None and cond["status"] == "True"

    until(installed, timeout=60, what=f"{name} Installed")


def _drifted_event(kube: Kube, name: str) -> bool:
    items, _ = kube.list("v1", "Event", namespace="default")
    return any(
        e.get("reason") == "DriftCorrected" and e["involvedObject"].get("name") == name
        for e in items
    )


def _round(kube: Kube, workdir: Path, i: int) -> float:
    name = f"drift-{i}-{uuid.uuid4().hex[:4]}"
    _install(kube, workdir, name)
    started = time.monotonic()
    kube.apply(configmap("cfg", name, mode="theirs"), manager="kubectl-edit")
    until(lambda: _drifted_event(kube, name), timeout=30, what="the event", interval=0.01)
    return time.monotonic() - started


def run(workdir: Path) -> list[Result]:
    cluster = start_cluster(workdir)
    try:
        kube = Kube.from_kubeconfig(str(cluster.kubeconfig))
        install_crds(kube)
        with harness.running_controller(
            kube, SYSTEM_NS, image="registry.example/rukpak:bench", resolve=as_is
        ):
            harness.let_the_instance_write_anything(kube, SYSTEM_NS)
            took = [_round(kube, workdir, i) for i in range(ROUNDS)]
        progress(f"drift: Drifted event after {[round(t, 3) for t in took]}s")
        return [
            timed(
                "drift: another writer's change -> Drifted event naming it (manager in-process)",
                took,
                target=1.0,
            )
        ]
    finally:
        cluster.stop()
