"""The Bundle and BundleDeployment CRDs installed on a test API server.

Where it sits: the cluster tests that need our CRDs served (``test_manager_crds``,
``test_manager_controller``, ``test_source_configmaps``) call ``install_crds`` from a
module fixture.
"""

from __future__ import annotations

import functools

import yaml

from provisioner.engine.kube import Kube
from provisioner.engine.objects import ObjectRef, condition
from provisioner.manager import model
from tests.polling import eventually


def install_crds(kube: Kube) -> None:
    """Apply both CRDs and wait until they are Established and served."""
    for path in model.crd_files():
        for doc in yaml.safe_load_all(path.read_text()):
            kube.apply(doc)
            ref = ObjectRef.of(doc)

            def established(ref: ObjectRef = ref) -> bool:
                live = kube.get(ref)
                cond = condition(live or {}, "Established")
                return bool(cond and cond.get("status") == "True")

            eventually(established, timeout=30, what=f"{ref} Established")
    for kind in (model.BUNDLE, model.BUNDLE_DEPLOYMENT):
        eventually(functools.partial(kube.resource, model.API_VERSION, kind), timeout=30)
