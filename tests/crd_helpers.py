"""The Bundle and BundleDeployment CRDs installed on a test API server.

Where it sits: the cluster tests that need our CRDs served (``test_manager_crds``,
``test_manager_controller``, ``test_source_configmaps``, ``test_conversion``) call
``install_crds`` from a module fixture. The BundleDeployment CRD converts between
v1alpha1 and v1alpha2 through a webhook; where no manager runs, ``install_crds`` serves
the manager's own webhook (``provisioner.manager.serving.webhook.Server``) in this process on a
loopback port and points the CRD at it (as ``deploy/components/host-network`` points it
at the manager's). The server is stopped when the test process exits.
"""

from __future__ import annotations

import atexit
import base64
import copy
import functools
import threading

import yaml

from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef, condition
from provisioner.manager import model
from provisioner.manager.serving import certs, webhook
from tests.polling import eventually

_lock = threading.Lock()
_server: tuple[webhook.Server, bytes] | None = None


def conversion_webhook() -> tuple[str, bytes]:
    """(URL of ``/convert``, CA PEM) of this process's conversion webhook, started once."""
    global _server
    with _lock:
        if _server is None:
            bundle = certs.generate(["127.0.0.1", "localhost"])
            server = webhook.Server(lambda old, new: {}, bundle, host="127.0.0.1", port=0)
            server.start()
            atexit.register(server.stop)
            _server = (server, bundle.ca)
        server, ca = _server
    return f"https://127.0.0.1:{server.port}{webhook.CONVERT_PATH}", ca


def with_local_conversion(doc: Obj) -> Obj:
    """``doc`` (a CRD) with its conversion webhook pointed at ``conversion_webhook``."""
    conversion = (doc.get("spec") or {}).get("conversion") or {}
    if conversion.get("strategy") != "Webhook":
        return doc
    url, ca = conversion_webhook()
    out = copy.deepcopy(doc)
    out["spec"]["conversion"]["webhook"]["clientConfig"] = {
        "url": url,
        "caBundle": base64.b64encode(ca).decode(),
    }
    return out


def install_crds(kube: Kube) -> None:
    """Apply both CRDs and wait until they are Established and served in every version."""
    for path in model.crd_files():
        for doc in yaml.safe_load_all(path.read_text()):
            kube.apply(with_local_conversion(doc))
            ref = ObjectRef.of(doc)

            def established(ref: ObjectRef = ref) -> bool:
                live = kube.get(ref)
                cond = condition(live or {}, "Established")
                return bool(cond and cond.get("status") == "True")

            eventually(established, timeout=30, what=f"{ref} Established")
    for api_version, kind in (
        (model.API_VERSION, model.BUNDLE),
        (model.API_VERSION, model.BUNDLE_DEPLOYMENT),
        (model.API_VERSION_V2, model.BUNDLE_DEPLOYMENT),
    ):
        eventually(functools.partial(kube.resource, api_version, kind), timeout=30)
