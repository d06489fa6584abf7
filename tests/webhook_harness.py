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

import pytest

from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef
from provisioner.manager.serving import certs, webhook
from tests.polling import eventually


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
    *,
    probe: Callable[[], object] | None = None,
    **server: Any,
) -> Iterator[webhook.Server]:
    """``webhook.Server(existing, **server)`` started on a loopback port, and the
    ValidatingWebhookConfiguration ``configuration`` of the one webhook ``hook(base_url)``
    gives (``base_url``: the server's ``https://127.0.0.1:<port>``), until the block ends.

    The API server takes up the published caBundle a moment after the patch; until then
    its calls fail TLS. With ``probe`` (a write the webhook admits), the block starts once
    a probe went through."""
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
        if probe is not None:
            eventually(probe, timeout=30, what=f"the API server calling {configuration}")
        yield srv
    finally:
        kube.delete(ref)
        srv.stop()


def server_fixture(
    namespace: str,
    configuration: str,
    hook: Callable[[str], Obj],
    server: Callable[[Kube], dict[str, Any]],
) -> Any:
    """A module-scoped ``server`` fixture: ``serving`` with the webhook ``hook`` and the
    arguments ``server(kube)`` gives (``existing``, ``probe`` and the server's options)."""

    def serve(kube: Kube) -> Iterator[webhook.Server]:
        options = server(kube)
        existing = options.pop("existing")
        with serving(kube, namespace, configuration, hook, existing, **options) as srv:
            yield srv

    return pytest.fixture(scope="module", name="server")(serve)
