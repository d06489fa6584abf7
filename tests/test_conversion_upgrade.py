"""The upgrade path on a real API server of its own: v1alpha1 BundleDeployments made by the
previous release (CRD v1alpha1 only, objects stored as v1alpha1 in etcd) keep working,
unchanged, once this release's CRD (v1alpha2 storage, conversion webhook) is applied.

The previous release's CRD is kept in ``tests/data/previous-release``. After the upgrade
the object reads the same in v1alpha1, reads as v1alpha2 through the conversion, and the
new manager (its controller, in this process) keeps the Bundle the old one generated: no
pivot, no second Bundle, the instance run mounts the old Bundle.
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef
from provisioner.manager import controller, model
from provisioner.manager.acting import actuate
from provisioner.manager.planning import generate
from tests import plan_helpers
from tests.bundles import bundle_deployment
from tests.cluster import bins
from tests.cluster.localcluster import LocalCluster
from tests.crd_helpers import install_crds
from tests.polling import eventually

PREVIOUS = Path(__file__).parent / "data" / "previous-release"
SYSTEM_NS = "rukpak-upgrade"
IMAGE = "registry.example/rukpak:old"
DIGEST_REF = "registry.example/hello@sha256:" + "a" * 64


@pytest.fixture(scope="module")
def kube() -> Iterator[Kube]:
    """A fresh etcd + kube-apiserver: the old CRD must be the first one this server sees."""
    workdir = Path(tempfile.mkdtemp(prefix="rk-upgrade-"))
    cluster = LocalCluster.start(workdir, node=False, binaries=bins.ensure(bins.CONTROL_PLANE))
    client = Kube.from_kubeconfig(str(cluster.kubeconfig))
    try:
        yield client
    finally:
        client.close()
        cluster.stop(remove=True)


def apply_previous_release(kube: Kube) -> None:
    bundle_crd = model.CRDS_DIR / "core.rukpak.io_bundles.yaml"  # unchanged by this release
    for path in (PREVIOUS / "core.rukpak.io_bundledeployments.yaml", bundle_crd):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                kube.apply(doc)
    for kind in (model.BUNDLE, model.BUNDLE_DEPLOYMENT):
        eventually(functools.partial(kube.serves, model.API_VERSION, kind), timeout=30)


def test_v1alpha1_objects_of_the_previous_release_keep_working_after_the_upgrade(
    kube: Kube,
) -> None:
    apply_previous_release(kube)
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NS}})
    account = {"apiVersion": "v1", "kind": "ServiceAccount"}
    kube.apply({**account, "metadata": {"name": "rukpak-instance", "namespace": SYSTEM_NS}})
    name = "combo"
    # what the previous release made: the BD, its generated Bundle (unpacked), its status
    made = kube.create(bundle_deployment(name, DIGEST_REF))
    bundle = generate.desired_bundle(made)
    kube.create(bundle)
    pinned = {"type": "image", "image": {"ref": DIGEST_REF}}
    kube.merge_patch_status(
        actuate.bundle_ref(model.bundle_name(made)),
        {
            "status": {
                "phase": "Unpacked",
                "resolvedSource": pinned,
                "observedGeneration": 1,
                "conditions": [
                    {
                        "type": "Unpacked",
                        "status": "True",
                        "reason": "UnpackSuccessful",
                        "message": "Successfully unpacked the image Bundle",
                        "lastTransitionTime": "2026-01-01T00:00:00Z",
                    }
                ],
            }
        },
    )
    status = {
        "activeBundle": model.bundle_name(made),
        "observedGeneration": 1,
        "conditions": [
            {
                "type": "HasValidBundle",
                "status": "True",
                "reason": "UnpackSuccessful",
                "message": "Successfully unpacked the " + model.bundle_name(made) + " Bundle",
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
    }
    before = kube.merge_patch_status(actuate.bd_ref(name), {"status": status})
    crd = ObjectRef(
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "",
        "bundledeployments.core.rukpak.io",
    )
    assert (kube.get(crd) or {})["status"]["storedVersions"] == ["v1alpha1"]

    install_crds(kube)  # the new release's CRDs (its conversion served by this process)

    after = kube.get(actuate.bd_ref(name))
    assert after is not None
    for key in ("spec", "status"):
        assert after[key] == before[key]
    assert after["metadata"].get("annotations") == before["metadata"].get("annotations")
    as_v2 = kube.get(actuate.bd_ref(name, model.API_VERSION_V2))
    assert as_v2 is not None and as_v2["spec"]["source"] == pinned
    assert as_v2["status"]["activeBundle"] == model.bundle_name(made)
    assert set((kube.get(crd) or {})["status"]["storedVersions"]) == {"v1alpha1", "v1alpha2"}

    # the new manager plans it as v1alpha1: the same Bundle, no pivot
    settings = model.Settings(image=IMAGE, system_namespace=SYSTEM_NS, host_network=True)
    ctl = controller.Controller(
        kube, settings, resolve=plan_helpers.as_is, resync=2.0, watch_timeout=10
    )
    ctl.start()
    try:

        def run_pods() -> list[Obj]:
            items, _ = kube.list("v1", "Pod", namespace=SYSTEM_NS, label_selector=model.BD_LABEL)
            return items

        pods = eventually(run_pods, timeout=60, what="the new manager's instance run")
        assert {p["metadata"]["annotations"][model.BUNDLE_ANNOTATION] for p in pods} == {
            model.bundle_name(made)
        }
        bundles, _ = kube.list(model.API_VERSION, model.BUNDLE)
        assert [model.name_of(b) for b in bundles] == [model.bundle_name(made)]
        final = kube.get(actuate.bd_ref(name))
        assert final is not None and final["spec"] == before["spec"]
        assert final["metadata"].get("finalizers") == [model.FINALIZER]
    finally:
        ctl.stop()
