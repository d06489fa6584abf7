"""Benchmark: rolling back from the node cache with the registry stopped, against a cold
install, on the installed system.

Where it sits: ``make bench`` (``python -m tests.bench lifecycle``). Starts the local
cluster, builds the image and installs ``deploy/`` as ``bench_install`` does; then, each
round with a registry of its own (a real docker-registry on loopback) holding two tiny
bundles (a Namespace and a ConfigMap) that no node has seen:

- **cold install** (the baseline): a v1alpha2 BundleDeployment of the first bundle created
  -> Installed and Healthy (its tag resolved and its image pulled from the registry);
- an upgrade to the second bundle (untimed), then the registry process is stopped;
- **rollback**: the rollback annotation (what ``rukpak rollback`` writes) -> revision 1
  Installed and Healthy again, from the node cache alone.

The ratio is rollback / cold install, per round, median over the rounds; the goal is the
issue's (<= 0.5x).
"""

from __future__ import annotations

import time
from pathlib import Path

import yaml

from provisioner.engine.apply import revisionlog
from provisioner.engine.objects import ObjectRef
from tests import e2e_helpers as e2e
from tests import install_helpers as inst
from tests.bench import Result, against, bench_install, progress
from tests.polling import until
from tests.registry import RegistryServer

ROUNDS = 5
GROUP, VERSION, KIND = "core.rukpak.io", "v1alpha2", "BundleDeployment"


def _ref(name: str) -> ObjectRef:
    return ObjectRef(GROUP, VERSION, KIND, "", name)


def _bundle(root: Path, ns: str, value: str) -> Path:
    manifests = root / "manifests"
    manifests.mkdir(parents=True)
    docs = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "value", "namespace": ns},
            "data": {"value": value},
        },
    ]
    for index, doc in enumerate(docs):
        (manifests / f"{index:02d}.yaml").write_text(yaml.safe_dump(doc))
    return root


def _ready(system: inst.RukpakSystem, name: str, revision: int) -> bool:
    bd = system.kube.get(_ref(name)) or {}
    status = bd.get("status") or {}
    conds = inst.conditions(bd)
    return status.get("installedRevision") == revision and all(
        conds.get(t, {}).get("status") == "True" for t in ("Installed", "Healthy")
    )


def _round(system: inst.RukpakSystem, workdir: Path, index: int) -> tuple[float, float]:
    name = ns = f"bench-rollback-{index}"
    registry = RegistryServer.start(workdir / f"registry-{index}")
    try:
        refs = []
        for tag in ("a", "b"):
            ref = f"{registry.host}/bench-rollback/{name}:{tag}"
            e2e.push_bundle(_bundle(workdir / f"{name}-{tag}", ns, f"{tag}-{time.time()}"), ref)
            refs.append(ref)
        bd = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            "metadata": {"name": name},
            "spec": {
                "installNamespace": ns,
                "provisionerClassName": "core-rukpak-io-plain",
                "source": {"type": "image", "image": {"ref": refs[0]}},
            },
        }
        started = time.monotonic()
        system.kube.create(bd)
        until(lambda: _ready(system, name, 1), timeout=300, what=f"{name} revision 1")
        cold = time.monotonic() - started
        system.kube.merge_patch(
            _ref(name), {"spec": {"source": {"type": "image", "image": {"ref": refs[1]}}}}
        )
        until(lambda: _ready(system, name, 2), timeout=300, what=f"{name} revision 2")
    finally:
        registry.stop()
    live = system.kube.get(_ref(name)) or {}
    generation = int(live["metadata"]["generation"])
    value = revisionlog.rollback_annotation(1, generation, revisionlog.MANUAL)
    started = time.monotonic()
    system.kube.merge_patch(
        _ref(name), {"metadata": {"annotations": {revisionlog.ROLLBACK_ANNOTATION: value}}}
    )
    until(lambda: _ready(system, name, 1), timeout=300, what=f"{name} rolled back")
    rollback = time.monotonic() - started
    system.kubectl("delete", f"bundledeployments.{VERSION}.{GROUP}", name, timeout=200)
    return cold, rollback


def measure(system: inst.RukpakSystem, workdir: Path) -> list[Result]:
    colds: list[float] = []
    rollbacks: list[float] = []
    ratios: list[float] = []
    for index in range(ROUNDS):
        cold, rollback = _round(system, workdir, index)
        progress(f"lifecycle: round {index}: cold install {cold:.2f}s, rollback {rollback:.2f}s")
        colds.append(cold)
        rollbacks.append(rollback)
        ratios.append(rollback / cold)
    return [
        against(
            "lifecycle: rollback with the registry stopped vs a cold install",
            rollbacks,
            colds,
            target=0.5,
            note=(
                f"medians of {ROUNDS}; per-round ratios {[round(r, 2) for r in ratios]}; "
                f"cold {[round(x, 2) for x in colds]}, rollback {[round(x, 2) for x in rollbacks]}"
            ),
        )
    ]


def run(workdir: Path) -> list[Result]:
    return bench_install.on_installed_system(workdir, "lifecycle", measure)
