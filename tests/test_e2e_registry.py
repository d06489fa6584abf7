"""End to end: a registry+v1 operator bundle (provisioner class core-rukpak-io-registry).

RukPak is installed from ``deploy/`` as users install it (the ``standing_system``
fixture, ``tests.install_helpers``): the standing provisioner takes every run and
no pod is started for any change (checked after each test). The operator bundle is F's fixture
``tests/data/registry-v1/cache-operator`` (three CRDs, a CSV with cluster
permissions and three Deployments), copied and given the cluster's busybox image so
its Deployments can become Available on the local kubelet, then pushed with
``rukpak bundle build --push`` (which packs ``metadata/`` too). Checked: a standalone
Bundle of the registry class is Unpacked by the standing provisioner running the
registry+v1 loader; a BundleDeployment of that class is Installed, the CRDs exist and the
operator's Deployments become Available; deleting it removes them.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.engine.objects import Obj, ObjectRef
from provisioner.manager import model
from provisioner.manager.acting import actuate
from tests import e2e_helpers as e2e
from tests import install_helpers as inst
from tests.bundles import bundle_doc
from tests.polling import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SUFFIX = uuid.uuid4().hex[:6]
FIXTURE = Path(__file__).parent / "data" / "registry-v1" / "cache-operator"
CSV_FILE = "manifests/cache-operator.clusterserviceversion.yaml"
OPERATOR_NAMESPACE = "cache-operator-system"
"""``<package>-system``: the CSV suggests no namespace."""
CRDS = ("backups.cache.example.com", "memcacheds.cache.example.com", "redises.cache.example.com")
DEPLOYMENTS = (
    "cache-operator-controller-manager",
    "cache-operator-exporter",
    "cache-operator-webui",
)


def runnable_operator(target: Path, image: str) -> Path:
    """A copy of the fixture whose operator containers run ``image`` with ``sleep``."""
    shutil.copytree(FIXTURE, target)
    csv_path = target / CSV_FILE
    csv: Any = yaml.safe_load(csv_path.read_text())
    for dep in csv["spec"]["install"]["spec"]["deployments"]:
        pod_spec = dep["spec"]["template"]["spec"]
        for container in pod_spec["containers"]:
            container["image"] = image
            container["command"] = ["sleep", "3600"]
            container.pop("args", None)
        # busybox runs as root; keep a runAsNonRoot pod startable
        pod_spec.setdefault("securityContext", {})["runAsUser"] = 65534
    csv_path.write_text(yaml.safe_dump(csv, sort_keys=False))
    return target


def registry_bd(name: str, ref: str) -> Obj:
    bd = inst.bundle_deployment(name, ref)
    bd["spec"]["provisionerClassName"] = model.REGISTRY_CLASS
    bd["spec"]["template"]["spec"]["provisionerClassName"] = model.REGISTRY_CLASS
    return bd


@pytest.fixture(scope="module")
def operator_ref(
    standing_system: inst.RukpakSystem, tmp_path_factory: pytest.TempPathFactory
) -> str:
    root = runnable_operator(
        tmp_path_factory.mktemp("registry") / "cache-operator", standing_system.busybox_image
    )
    ref = f"{standing_system.registry_host}/e2e-registry-{SUFFIX}/cache-operator:v0.1.0"
    e2e.push_bundle(root, ref)
    return ref


def _cond(obj: Obj | None, kind: str) -> tuple[str, str, str]:
    c = inst.conditions(obj).get(kind) or {}
    return str(c.get("status")), str(c.get("reason")), str(c.get("message"))


def test_a_registry_bundle_is_unpacked_with_the_registry_v1_loader(
    standing_system: inst.RukpakSystem, operator_ref: str
) -> None:
    name = f"cache-operator-{SUFFIX}"
    kube = standing_system.kube
    kube.create(bundle_doc(name, operator_ref, cls=model.REGISTRY_CLASS))
    try:
        phase = eventually(
            lambda: (
                p
                if (
                    p := ((kube.get(actuate.bundle_ref(name)) or {}).get("status") or {}).get(
                        "phase"
                    )
                )
                in ("Unpacked", "Failing")
                else None
            ),
            timeout=180,
            what=f"Bundle {name} Unpacked or Failing",
        )
        live = kube.get(actuate.bundle_ref(name))
        status, reason, message = _cond(live, "Unpacked")
        assert (phase, status, reason) == ("Unpacked", "True", "UnpackSuccessful"), message
        # the registry+v1 conversion ran: CSV-derived kinds, not the CSV itself
        assert "CustomResourceDefinition 3" in message
        assert "Deployment 3" in message
        assert "ClusterServiceVersion" not in message
    finally:
        kube.delete(actuate.bundle_ref(name))


def test_a_registry_bundledeployment_installs_the_operator_and_uninstalls_it(
    standing_system: inst.RukpakSystem, operator_ref: str
) -> None:
    name = f"cache-op-{SUFFIX}"
    kube = standing_system.kube
    kube.create(registry_bd(name, operator_ref))

    def installed() -> Obj | None:
        bd = kube.get(actuate.bd_ref(name))
        status, reason, _ = _cond(bd, "Installed")
        if (status, reason) == ("True", "InstallationSucceeded"):
            return bd
        if _cond(bd, "HasValidBundle")[0] == "False":
            pytest.fail(f"BundleDeployment {name} failed: {(bd or {}).get('status')}")
        return None

    bd = eventually(installed, timeout=240, what=f"BundleDeployment {name} Installed")
    active = str((bd.get("status") or {}).get("activeBundle") or "")
    assert _cond(bd, "Installed")[2] == f"Instantiated bundle {active} successfully"
    for crd in CRDS:
        ref = ObjectRef("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "", crd)
        assert kube.get(ref) is not None, f"CRD {crd} missing"

    def available(dep: str) -> bool:
        ref = ObjectRef("apps", "v1", "Deployment", OPERATOR_NAMESPACE, dep)
        live = kube.get(ref)
        return _cond(live, "Available")[0] == "True"

    eventually(
        lambda: all(available(dep) for dep in DEPLOYMENTS),
        timeout=180,
        what=f"Deployments {', '.join(DEPLOYMENTS)} Available",
    )

    # upstream's order of checks: the CRDs go, and then the BD is NotFound at once
    kube.delete(actuate.bd_ref(name))
    crd_refs = [
        ObjectRef("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "", crd) for crd in CRDS
    ]
    eventually(
        lambda: all(kube.get(ref) is None for ref in crd_refs), timeout=180, what="CRDs removed"
    )
    assert kube.get(actuate.bd_ref(name)) is None
