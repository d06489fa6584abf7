"""Benchmark: the two install paths of issue 22's goals on a v1alpha2 BundleDeployment,
whose content is its inline source (no Bundle object, no unpack pod).

Where it sits: ``make bench`` (``python -m tests.bench inline``, about 4 minutes). Starts
the local cluster and installs ``deploy/`` as ``bench_install`` does, pushes the hello
bundle twice (the second with another greeting), then measures with the image cached on
the node:

- **created -> Installed and Healthy**: a v1alpha2 BundleDeployment of hello created,
  until both conditions are True (hello's Deployment available); median of 5 after a
  warm-up, the BundleDeployment and its namespace deleted between rounds;
- **source change -> new content applied**: ``spec.source.image.ref`` switched between
  the two pushes, until hello's ConfigMap carries the new greeting; median of 5.

``bench_install`` measures the same on v1alpha1 (template, Bundle, unpack pod); the goals
(2.5 s and 2 s) are the issue's, absolute: there is no baseline to take a ratio against
in the same run.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

from provisioner.engine.objects import ObjectRef
from provisioner.manager import model
from provisioner.manager.acting import actuate
from tests import install_helpers as inst
from tests.bench import Result, bench_install

NAME = NAMESPACE = "hello"


def _ready(system: inst.RukpakSystem) -> bool:
    return all(inst.cond_v2(system, NAME, kind)[0] == "True" for kind in ("Installed", "Healthy"))


def _create(system: inst.RukpakSystem, ref: str) -> float:
    bd = inst.bd_v2(NAME, ref)
    bd["spec"]["installNamespace"] = NAMESPACE
    started = time.monotonic()
    system.kube.create(bd)
    bench_install._wait(lambda: _ready(system), timeout=300, what=f"{NAME} Installed and Healthy")
    return time.monotonic() - started


def _delete(system: inst.RukpakSystem) -> None:
    system.kubectl("delete", inst.BDS_V2, NAME, "--timeout=180s", timeout=200)
    namespace = ObjectRef("", "v1", "Namespace", "", NAMESPACE)
    gone = functools.partial(bench_install._gone, system, namespace)
    bench_install._wait(gone, timeout=180, what=f"namespace {NAMESPACE} to go")


def _switch(system: inst.RukpakSystem, ref: str, greeting: str) -> float:
    patch = {"spec": {"source": {"type": "image", "image": {"ref": ref}}}}
    started = time.monotonic()
    system.kube.merge_patch(actuate.bd_ref(NAME, model.API_VERSION_V2), patch)
    has = functools.partial(bench_install._has_greeting, system, greeting)
    bench_install._wait(has, timeout=300, what=greeting, interval=0.02)
    took = time.monotonic() - started
    bench_install._wait(lambda: _ready(system), timeout=300, what=f"{NAME} settled")
    return took


def measure(system: inst.RukpakSystem, workdir: Path) -> list[Result]:
    v1, v2 = bench_install.push_hello(system, workdir, "inline")
    created = bench_install.time_creates(
        "inline: v1alpha2 BundleDeployment created -> Installed+Healthy (hello, cached)",
        bench="inline",
        create=lambda: _create(system, v1),
        delete=lambda: _delete(system),
    )
    switched = bench_install.time_pivots(
        "inline: v1alpha2 source change -> new content applied",
        bench="inline",
        change="source change",
        switch=lambda ref, greeting: _switch(system, ref, greeting),
        refs=(v1, v2),
    )
    _delete(system)
    return [created, switched]


def run(workdir: Path) -> list[Result]:
    return bench_install.on_installed_system(workdir, "inline", measure)
