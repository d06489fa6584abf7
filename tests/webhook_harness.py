"""The manager's admission webhook served in-process to a real kube-apiserver.

Where it sits: the fixtures of the webhook tests (``test_manager_webhook`` for CRD
upgrade safety, ``test_webhook_cycles`` for ``spec.dependsOn`` cycles). The server runs on
a loopback port with the certificate ``certs.ensure`` keeps in a Secret; a
ValidatingWebhookConfiguration of one webhook (its caBundle written by
``certs.publish_ca``) points the API server at it, so writes go through the API server as
any user's would.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef
from provisioner.manager import certs, webhook


@contextmanager
def client_with_namespace(kube_apiserver: Any, namespace: str) -> Iterator[Kube]:
    """A client of the session's API server, with ``namespace`` (where the webhook's
    certificate Secret is kept) created."""
    kube = Kube.from_kubeconfig(str(kube_apiserver.kubeconfig))
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    try:
        yield kube
    finally:
        kube.close()


@contextmanager
def serving(
    kube: Kube,
    namespace: str,
    configuration: str,
    hook: Callable[[str], Obj],
    existing: webhook.Existing,
    **server: Any,
) -> Iterator[webhook.Server]:
    """``webhook.Server(existing, **server)`` started on a loopback port, and the
    ValidatingWebhookConfiguration ``configuration`` of the one webhook ``hook(base_url)``
    gives (``base_url``: the server's ``https://127.0.0.1:<port>``), until the block ends."""
    bundle = certs.ensure(kube, namespace, ["127.0.0.1"])
    srv = webhook.Server(existing, bundle, host="127.0.0.1", port=0, **server)
    srv.start()
    ref = ObjectRef(
        "admissionregistration.k8s.io", "v1", "ValidatingWebhookConfiguration", "", configuration
    )
    try:
        kube.apply(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingWebhookConfiguration",
                "metadata": {"name": configuration},
                "webhooks": [hook(f"https://127.0.0.1:{srv.port}")],
            }
        )
        assert certs.publish_ca(kube, configuration, bundle.ca)
        yield srv
    finally:
        kube.delete(ref)
        srv.stop()
