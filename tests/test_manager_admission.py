"""The webhook's pure parts: ``webhook.decide``/``review`` and ``certs.generate``/``usable``.

tests/test_manager_webhook.py runs the same through a real API server.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence

from provisioner.engine.objects import OWNER_LABEL, Obj
from provisioner.manager.serving import certs, webhook
from tests import bundles


def crd(
    size_type: str = "integer", *, owned: bool = True, annotations: dict[str, str] | None = None
) -> Obj:
    obj = bundles.crd(
        "x.io",
        spec_props={"size": {"type": size_type}},
        annotations=annotations,
    )
    obj["metadata"]["labels"] = {OWNER_LABEL: "bd"} if owned else {}
    obj["status"] = {"storedVersions": ["v1"]}
    return obj


WIDGET = {"apiVersion": "x.io/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {"size": 3}}


def existing(old: Obj, new: Obj) -> Mapping[str, Sequence[Obj]]:
    return {"v1": [WIDGET]}


def test_an_unsafe_update_of_an_owned_crd_is_denied_in_upstreams_words() -> None:
    reason = webhook.decide("UPDATE", crd(), crd("string"), existing)
    assert reason.startswith(
        'failed to validate safety of UPDATE for CRD "widgets.x.io" (NOTE: to disable this '
        'validation, set the "core.rukpak.io/safe-crd-upgrade-validation" annotation to '
        '"false"): error validating existing CRs against new CRD\'s schema for "widgets.x.io": '
        "existing custom object /w failed validation for new schema version v1: spec.size: "
    )


def test_what_is_admitted() -> None:
    assert webhook.decide("UPDATE", crd(), crd(), existing) == ""
    assert webhook.decide("CREATE", None, crd("string"), existing) == ""
    assert webhook.decide("UPDATE", crd(owned=False), crd("string", owned=False), existing) == ""
    disabled = crd("string", annotations={"core.rukpak.io/crd-upgrade-safety": "disabled"})
    assert webhook.decide("UPDATE", crd(), disabled, existing) == ""
    upstream = crd("string", annotations={"core.rukpak.io/safe-crd-upgrade-validation": "false"})
    assert webhook.decide("UPDATE", crd(), upstream, existing) == ""


def test_the_review_answers_with_the_request_uid() -> None:
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "abc",
            "operation": "UPDATE",
            "name": "widgets.x.io",
            "oldObject": crd(),
            "object": crd("string"),
        },
    }
    answer = webhook.review(body, existing)
    assert answer["response"]["uid"] == "abc"
    assert answer["response"]["allowed"] is False
    assert answer["response"]["status"]["code"] == 403


def test_a_generated_certificate_serves_its_hosts_until_close_to_expiry() -> None:
    bundle = certs.generate(["svc.ns.svc", "127.0.0.1"])
    assert certs.usable(bundle, ["svc.ns.svc", "127.0.0.1"])
    assert not certs.usable(bundle, ["other.ns.svc"])
    later = datetime.datetime.now(datetime.UTC) + certs.VALIDITY - datetime.timedelta(days=1)
    assert not certs.usable(bundle, ["svc.ns.svc"], now=later)
    assert not certs.usable(certs.Bundle(ca=b"x", cert=b"y", key=b"z"), ["svc.ns.svc"])
