"""The CRD upgrade-safety webhook on a real kube-apiserver, which calls it over HTTPS.

The webhook server runs in-process on a loopback port with the certificate
``certs.ensure`` keeps in a Secret; a ValidatingWebhookConfiguration (its
caBundle written by ``certs.publish_ca``) points the API server at it, limited
by an object selector to this module's CRDs so other tests sharing the API
server are not affected. Then CRD updates go through the API server as any
user's would.
"""

from __future__ import annotations

import base64
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import OWNER_LABEL, Obj, ObjectRef, condition
from provisioner.manager import model
from provisioner.manager.serving import certs, webhook
from provisioner.runtime.metrics import Metrics
from rukpak.common import errors, httpanswer
from tests import webhook_harness
from tests.httpreply import probe
from tests.polling import eventually

pytestmark = [pytest.mark.cluster]

SUFFIX = uuid.uuid4().hex[:6]
NAMESPACE = f"rukpak-webhook-{SUFFIX}"
SELECTOR_LABEL = "rukpak-test-webhook"
METRICS = Metrics()
"""The server's metrics: what the API server's calls were counted as."""


def verdicts(verdict: str) -> float:
    value = METRICS.registry.get_sample_value(
        "rukpak_webhook_verdicts_total", {"webhook": webhook.PATH, "verdict": verdict}
    )
    return value or 0.0


CONFIGURATION = f"rukpak-crd-validator-{SUFFIX}"


@pytest.fixture(scope="module")
def kube(kube_apiserver: Any) -> Iterator[Kube]:
    with webhook_harness.client_with_namespace(kube_apiserver, NAMESPACE) as client:
        yield client


def crd_hook(base_url: str) -> Obj:
    """The CRD webhook, limited to this module's CRDs."""
    return {
        "name": "crd-validation.core.rukpak.io",
        "clientConfig": {"url": f"{base_url}{webhook.PATH}"},
        "rules": [
            {
                "apiGroups": ["apiextensions.k8s.io"],
                "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["customresourcedefinitions"],
            }
        ],
        "objectSelector": {"matchLabels": {SELECTOR_LABEL: SUFFIX}},
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": 10,
    }


server = webhook_harness.server_fixture(
    NAMESPACE,
    CONFIGURATION,
    crd_hook,
    lambda kube: {"existing": webhook.existing_from(kube), "metrics": METRICS},
)


def crd(plural: str, *, versions: list[Obj], owned: bool = True, **annotations: str) -> Obj:
    group = f"{SUFFIX}.webhook.example.com"
    labels = {SELECTOR_LABEL: SUFFIX}
    if owned:
        labels[OWNER_LABEL] = "some-bd"
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": f"{plural}.{group}",
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": plural[:-1], "kind": plural[:-1].title()},
            "versions": versions,
        },
    }


def version(name: str, size_type: str = "integer", *, storage: bool = True) -> Obj:
    return {
        "name": name,
        "served": True,
        "storage": storage,
        "schema": {
            "openAPIV3Schema": {
                "type": "object",
                "properties": {
                    "spec": {"type": "object", "properties": {"size": {"type": size_type}}}
                },
            }
        },
    }


def install(kube: Kube, doc: Obj, *, with_cr: bool = True) -> Obj:
    kube.apply(doc)
    ref = ObjectRef.of(doc)
    eventually(
        lambda: (condition(kube.get(ref) or {}, "Established") or {}).get("status") == "True",
        timeout=30,
        what=f"{ref} Established",
    )
    spec = doc["spec"]
    api_version = f"{spec['group']}/{spec['versions'][0]['name']}"
    cr = {
        "apiVersion": api_version,
        "kind": spec["names"]["kind"],
        "metadata": {"name": "one", "namespace": NAMESPACE},
        "spec": {"size": 3},
    }
    if with_cr:
        eventually(lambda: kube.serves(api_version, spec["names"]["kind"]), timeout=30)
        eventually(lambda: _created(kube, cr), timeout=30, what="the custom resource")
    return doc


def _created(kube: Kube, cr: Obj) -> bool:
    try:
        kube.apply(cr)
    except errors.NotFound:
        return False
    return True


def unique_plural(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:5]}s"


def test_an_update_that_invalidates_existing_resources_is_denied(
    kube: Kube, server: webhook.Server
) -> None:
    doc = install(kube, crd(unique_plural("widget"), versions=[version("v1")]))
    doc["spec"]["versions"] = [version("v1", "string")]
    denied = verdicts("denied")
    with pytest.raises(errors.RukpakError) as caught:
        kube.apply(doc)
    message = caught.value.message
    assert "error validating existing CRs against new CRD's schema" in message
    assert 'admission webhook "crd-validation.core.rukpak.io" denied' in message
    assert "one" in message and "size" in message
    # the API server's call was counted as a denial (the creates before it as allowed)
    assert verdicts("denied") == denied + 1
    assert verdicts("allowed") >= 1


def test_a_new_required_field_existing_resources_lack_is_denied_in_upstreams_words(
    kube: Kube, server: webhook.Server
) -> None:
    doc = install(kube, crd(unique_plural("widget"), versions=[version("v1")]))
    name = doc["metadata"]["name"]
    required = version("v1")
    spec_schema = required["schema"]["openAPIV3Schema"]["properties"]["spec"]
    spec_schema["properties"]["colour"] = {"type": "string"}
    spec_schema["required"] = ["colour"]
    doc["spec"]["versions"] = [required]
    with pytest.raises(errors.RukpakError) as caught:
        kube.apply(doc)
    # upstream's crdvalidator: its handler's words around internal/crd's, then the object
    assert (
        f'admission webhook "crd-validation.core.rukpak.io" denied the request: failed to '
        f'validate safety of UPDATE for CRD "{name}" (NOTE: to disable this validation, set '
        'the "core.rukpak.io/safe-crd-upgrade-validation" annotation to "false"): error '
        f'validating existing CRs against new CRD\'s schema for "{name}": existing custom '
        f"object {NAMESPACE}/one failed validation for new schema version v1: "
        "spec.colour: Required value"
    ) in caught.value.message
    live = kube.get(ObjectRef.of(doc)) or {}
    schema = live["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert "required" not in schema, "the denied update left the CRD as it was"


def test_no_longer_serving_a_stored_version_is_denied(kube: Kube, server: webhook.Server) -> None:
    # (removing it outright the API server refuses by itself, before any webhook)
    doc = install(kube, crd(unique_plural("gadget"), versions=[version("v1")]), with_cr=False)
    doc["spec"]["versions"] = [{**version("v1", storage=False), "served": False}, version("v2")]
    with pytest.raises(errors.RukpakError, match="version v1 is stored but would no longer be"):
        kube.apply(doc)


def test_clients_that_connect_and_say_nothing_or_no_tls_hold_up_no_review(
    kube: Kube, server: webhook.Server
) -> None:
    """The TLS handshake is each connection's own business: with one connection silent and
    one speaking plain HTTP, the API server's call still reaches the webhook and its denial
    comes back (before, the accepting loop waited on the silent client's handshake, so every
    review, and the kubelet's probes, waited too)."""
    with (
        socket.create_connection(("127.0.0.1", server.port)) as silent,
        socket.create_connection(("127.0.0.1", server.port)) as plain,
    ):
        plain.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
        doc = install(kube, crd(unique_plural("hush"), versions=[version("v1")]), with_cr=False)
        doc["spec"]["versions"] = [{**version("v1", storage=False), "served": False}, version("v2")]
        with pytest.raises(errors.RukpakError, match="version v1 is stored but would no longer be"):
            kube.apply(doc)
        assert probe(f"https://127.0.0.1:{server.port}/healthz")[0] == 200
        plain.settimeout(10)
        try:  # no HTTP answer without TLS: an alert, or the connection closed or reset
            said = plain.recv(4096)
        except ConnectionResetError:
            said = b""
        assert not said.startswith(b"HTTP"), said
        silent.settimeout(10)
        silent.sendall(b"x")  # still open: only its own thread waits on it


def test_a_silent_connection_is_closed_after_the_connection_timeout(
    server: webhook.Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(httpanswer, "CONNECTION_TIMEOUT", 0.5)
    with socket.create_connection(("127.0.0.1", server.port)) as silent:
        silent.settimeout(20)  # a failure here, not a hang
        assert silent.recv(1) == b""  # the server closed it


def test_a_compatible_update_is_admitted(kube: Kube, server: webhook.Server) -> None:
    doc = install(kube, crd(unique_plural("gizmo"), versions=[version("v1")]))
    doc["spec"]["versions"] = [version("v1", "integer"), version("v2", storage=False)]
    updated = kube.apply(doc)
    assert [v["name"] for v in updated["spec"]["versions"]] == ["v1", "v2"]


def test_a_crd_no_bundledeployment_owns_is_admitted(kube: Kube, server: webhook.Server) -> None:
    doc = install(kube, crd(unique_plural("thing"), versions=[version("v1")], owned=False))
    doc["spec"]["versions"] = [version("v1", "string")]
    updated = kube.apply(doc)
    schema = updated["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert schema["properties"]["spec"]["properties"]["size"]["type"] == "string"


@pytest.mark.parametrize(
    "annotation",
    [
        {"core.rukpak.io/crd-upgrade-safety": "disabled"},
        {"core.rukpak.io/safe-crd-upgrade-validation": "false"},
    ],
    ids=["ours", "upstream's"],
)
def test_the_opt_out_annotation_is_honoured(
    kube: Kube, server: webhook.Server, annotation: dict[str, str]
) -> None:
    doc = install(kube, crd(unique_plural("optout"), versions=[version("v1")]))
    doc["spec"]["versions"] = [version("v1", "string")]
    # without the annotation the webhook denies this very update ...
    with pytest.raises(errors.RukpakError) as caught:
        kube.apply(doc)
    assert 'admission webhook "crd-validation.core.rukpak.io" denied' in caught.value.message
    # ... with it, the update goes through and the new schema is stored
    doc["metadata"]["annotations"] = annotation
    updated = kube.apply(doc)
    assert updated["metadata"]["annotations"].items() >= annotation.items()
    schema = updated["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert schema["properties"]["spec"]["properties"]["size"]["type"] == "string"


def test_the_certificate_is_kept_in_a_secret_and_reused(kube: Kube, server: webhook.Server) -> None:
    first = certs.ensure(kube, NAMESPACE, ["127.0.0.1"])
    again = certs.ensure(kube, NAMESPACE, ["127.0.0.1"])
    assert first == again
    secret = kube.get(ObjectRef("", "v1", "Secret", NAMESPACE, certs.SECRET_NAME))
    assert secret is not None and secret["type"] == "kubernetes.io/tls"
    assert base64.b64decode(secret["data"]["ca.crt"]) == first.ca
    # other names: a new certificate replaces it
    other = certs.ensure(kube, NAMESPACE, ["127.0.0.1", "rukpak-webhook.x.svc"])
    assert other.cert != first.cert
    assert certs.usable(other, ["rukpak-webhook.x.svc"])
    configuration = kube.get(
        ObjectRef(
            "admissionregistration.k8s.io",
            "v1",
            "ValidatingWebhookConfiguration",
            "",
            CONFIGURATION,
        )
    )
    assert configuration is not None
    (hook,) = configuration["webhooks"]
    assert base64.b64decode(hook["clientConfig"]["caBundle"]) == first.ca


class _Reader:
    """A client that records who it lists custom resources as (pure logic: which user
    ``existing_from`` picks; the API server's answer to that user is the e2e suite's)."""

    def __init__(self, bds: dict[str, Obj], seen: list[str], user: str = "") -> None:
        self.bds, self.seen, self.user = bds, seen, user

    def get(self, ref: ObjectRef) -> Obj | None:
        return self.bds.get(ref.name)

    def impersonating(self, user: str) -> _Reader:
        return _Reader(self.bds, self.seen, user)

    def list(self, api_version: str, kind: str) -> tuple[list[Obj], str]:
        self.seen.append(self.user)
        return [], "1"


@pytest.mark.parametrize(
    ("old_owner", "new_owner", "expected"),
    [
        ("team", "team", "system:serviceaccount:rukpak-system:team-installer"),
        # an Orphan uninstall takes the label off: still read as the owner it had
        ("team", None, "system:serviceaccount:rukpak-system:team-installer"),
        # its BundleDeployment gone: the default instance identity, never the manager's own
        ("gone", None, "system:serviceaccount:rukpak-system:rukpak-instance"),
    ],
)
def test_existing_resources_are_listed_as_the_owning_deployments_instance(
    old_owner: str, new_owner: str | None, expected: str
) -> None:
    settings = model.Settings(image="x")
    bds = {"team": {"spec": {"serviceAccountName": "team-installer"}}}
    seen: list[str] = []
    old = crd("widgets", versions=[version("v1")])
    old["metadata"]["labels"][OWNER_LABEL] = old_owner
    new = crd("widgets", versions=[version("v1"), version("v2", storage=False)])
    if new_owner is None:
        del new["metadata"]["labels"][OWNER_LABEL]
    read = webhook.existing_from(_Reader(bds, seen), settings)  # type: ignore[arg-type]
    read(old, new)
    assert seen and set(seen) == {expected}
