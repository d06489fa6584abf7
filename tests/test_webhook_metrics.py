"""The manager's webhook server counting what it answers (controller-runtime's webhook
names and ``rukpak_webhook_verdicts_total``), and its certificate's end of validity
(``rukpak_webhook_certificate_expiry_timestamp_seconds``).

The real ``webhook.Server`` on a loopback HTTPS port, called as the API server calls it:
an AdmissionReview of a CRD create (allowed), a ConversionReview (converted, and one
that fails), a body that is not a review (refused), a path no webhook serves (answered
404, not counted). The API server calling it is ``test_manager_webhook``.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from provisioner.manager.serving import certs, webhook
from provisioner.runtime.metrics import Metrics
from tests.metrics_helpers import exposed


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, str, Metrics]]:
    bundle = certs.generate(["127.0.0.1"])
    ca = tmp_path / "ca.crt"
    ca.write_bytes(bundle.ca)
    metrics = Metrics()
    server = webhook.Server(lambda old, new: {}, bundle, host="127.0.0.1", port=0, metrics=metrics)
    server.start()
    try:
        yield f"https://127.0.0.1:{server.port}", str(ca), metrics
    finally:
        server.stop()


def post(base: str, ca: str, path: str, body: Any) -> requests.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return requests.post(
        base + path,
        data=data,
        headers={"Content-Type": "application/json"},
        verify=ca,
        timeout=10,
    )


def admission(operation: str) -> dict[str, Any]:
    crd = {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition"}
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": "u1", "operation": operation, "object": crd, "name": "x"},
    }


def conversion(objects: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "request": {
            "uid": "u2",
            "desiredAPIVersion": "core.rukpak.io/v1alpha2",
            "objects": objects,
        },
    }


def test_each_review_is_counted_by_webhook_code_and_verdict(
    served: tuple[str, str, Metrics],
) -> None:
    base, ca, metrics = served
    assert post(base, ca, webhook.PATH, admission("CREATE")).json()["response"]["allowed"]
    answer = post(base, ca, webhook.CONVERT_PATH, conversion([]))
    assert answer.json()["response"]["result"]["status"] == "Success"
    answer = post(base, ca, webhook.CONVERT_PATH, conversion("not a list"))
    assert answer.json()["response"]["result"]["status"] == "Failure"
    assert post(base, ca, webhook.PATH, b"[]").status_code == 400
    assert post(base, ca, "/validate-anything", admission("CREATE")).status_code == 404

    got = exposed(metrics)

    def verdicts(path: str, verdict: str) -> float:
        key = (("verdict", verdict), ("webhook", path))
        return got.get(("rukpak_webhook_verdicts_total", key), 0.0)

    assert verdicts(webhook.PATH, "allowed") == 1
    assert verdicts(webhook.PATH, "refused") == 1
    assert verdicts(webhook.CONVERT_PATH, "converted") == 1
    assert verdicts(webhook.CONVERT_PATH, "failed") == 1
    requests_by = {
        labels: value
        for (name, labels), value in got.items()
        if name == "controller_runtime_webhook_requests_total"
    }
    assert requests_by == {
        (("code", "200"), ("webhook", webhook.PATH)): 1,
        (("code", "400"), ("webhook", webhook.PATH)): 1,
        (("code", "200"), ("webhook", webhook.CONVERT_PATH)): 2,
    }
    latency = ("controller_runtime_webhook_latency_seconds_count", (("webhook", webhook.PATH),))
    assert got[latency] == 2
    in_flight = ("controller_runtime_webhook_requests_in_flight", (("webhook", webhook.PATH),))
    assert got[in_flight] == 0
    # a path of the caller's choosing never becomes a label value
    assert not [k for k in got if ("webhook", "/validate-anything") in k[1]]


def test_a_denied_review_is_counted_as_denied() -> None:
    doc = {"response": {"allowed": False}}
    assert webhook.verdict(webhook.PATH, 200, doc) == "denied"
    assert webhook.verdict(webhook.CONFIGMAP_PATH, 200, {"response": {"allowed": True}}) == (
        "allowed"
    )


def test_the_certificate_expiry_is_the_notafter_of_each_certificate() -> None:
    now = datetime.datetime(2030, 1, 1, tzinfo=datetime.UTC)
    bundle = certs.generate(["127.0.0.1"], now=now)
    expiry = certs.expiry(bundle)
    assert set(expiry) == {"serving", "ca"}
    assert expiry["serving"] == (now + certs.VALIDITY).timestamp()
    metrics = Metrics()
    for which, when in expiry.items():
        metrics.certificate_expiry.labels(which).set(when)
    key = (
        "rukpak_webhook_certificate_expiry_timestamp_seconds",
        (("certificate", "serving"),),
    )
    assert exposed(metrics)[key] == expiry["serving"]
