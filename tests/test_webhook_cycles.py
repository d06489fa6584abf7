"""``spec.dependsOn`` cycles refused at admission, on a real kube-apiserver that calls the
manager's webhook over HTTPS.

The webhook server runs in-process on a loopback port (``tests.webhook_harness``),
reading the other BundleDeployments through the API (``webhook.deployments_from``); a
ValidatingWebhookConfiguration shaped as ``deploy/webhook`` ships it (v1alpha2, matchPolicy
Equivalent) points the API server at ``webhook.BD_PATH``, limited by an object selector to
this module's BundleDeployments so other tests sharing the API server are not affected.
No manager runs: admission alone is judged here.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef
from provisioner.manager import model
from provisioner.manager.acting import actuate
from provisioner.manager.serving import webhook
from rukpak.common import errors
from tests import webhook_harness
from tests.crd_helpers import install_crds
from tests.install_helpers import bd_v2

pytestmark = [pytest.mark.cluster]

REPO_ROOT = Path(__file__).resolve().parent.parent
SUFFIX = uuid.uuid4().hex[:6]
NAMESPACE = f"rukpak-cycles-{SUFFIX}"
SELECTOR_LABEL = "rukpak-test-cycles"
CONFIGURATION = f"rukpak-bd-cycles-{SUFFIX}"
HOOK = "bundledeployment-dependencies.core.rukpak.io"
REF = "registry.example/hello@sha256:" + "1" * 64


def shipped_hook() -> Obj:
    """The BundleDeployment webhook as deploy/webhook ships it."""
    path = REPO_ROOT / "deploy/webhook/validatingwebhookconfiguration.yaml"
    shipped = yaml.safe_load(path.read_text())
    return next(h for h in shipped["webhooks"] if h["name"] == HOOK)


@pytest.fixture(scope="module")
def kube(kube_apiserver: Any) -> Iterator[Kube]:
    with webhook_harness.client_with_namespace(kube_apiserver, NAMESPACE) as client:
        install_crds(client)
        yield client


def cycles_hook(base_url: str) -> Obj:
    """The shipped BundleDeployment webhook, limited to this module's BundleDeployments; a
    webhook that does not answer fails the test."""
    hook = shipped_hook()
    hook["clientConfig"] = {"url": f"{base_url}{webhook.BD_PATH}"}
    hook["objectSelector"] = {"matchLabels": {SELECTOR_LABEL: SUFFIX}}
    hook["failurePolicy"] = "Fail"
    return hook


server = webhook_harness.server_fixture(
    NAMESPACE,
    CONFIGURATION,
    cycles_hook,
    lambda kube: {
        "existing": lambda old, new: {},
        "deployments": webhook.deployments_from(kube),
        "probe": lambda: admitted(kube),
    },
)


def admitted(kube: Kube) -> bool:
    """A BundleDeployment with no dependencies, created through the webhook and deleted."""
    name = unique("probe")
    kube.create(bd(name))
    kube.delete(ref(name))
    return True


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:5]}"


def bd(name: str, *needs: str, selected: bool = True) -> Obj:
    doc = bd_v2(name, REF, dependsOn=[{"name": n} for n in needs])
    if selected:
        doc["metadata"]["labels"] = {SELECTOR_LABEL: SUFFIX}
    return doc


def ref(name: str) -> ObjectRef:
    return actuate.bd_ref(name, model.API_VERSION_V2)


def set_depends_on(kube: Kube, name: str, *needs: str) -> Obj:
    return kube.merge_patch(ref(name), {"spec": {"dependsOn": [{"name": n} for n in needs]}})


def test_the_shipped_hook_sends_bundledeployment_writes_of_every_version_as_v1alpha2() -> None:
    hook = shipped_hook()
    (rule,) = hook["rules"]
    assert rule["resources"] == ["bundledeployments"] and rule["apiVersions"] == ["v1alpha2"]
    assert sorted(rule["operations"]) == ["CREATE", "UPDATE"]
    assert hook["matchPolicy"] == "Equivalent"
    assert hook["clientConfig"]["service"]["path"] == webhook.BD_PATH


def test_a_create_closing_a_cycle_is_refused_naming_it(kube: Kube, server: webhook.Server) -> None:
    a, b = unique("a"), unique("b")
    kube.create(bd(b, a))  # a does not exist yet: no cycle
    with pytest.raises(errors.RukpakError) as caught:
        kube.create(bd(a, b))
    message = caught.value.message
    assert f'admission webhook "{HOOK}" denied' in message
    assert f"spec.dependsOn closes a cycle: {a} -> {b} -> {a}" in message
    assert kube.get(ref(a)) is None


def test_an_update_closing_a_three_cycle_is_refused_and_one_that_does_not_is_admitted(
    kube: Kube, server: webhook.Server
) -> None:
    a, b, c, d = (unique(x) for x in "abcd")
    kube.create(bd(a))
    kube.create(bd(b, a))
    kube.create(bd(c, b))
    with pytest.raises(errors.RukpakError) as caught:
        set_depends_on(kube, a, c)
    assert f"spec.dependsOn closes a cycle: {a} -> {c} -> {b} -> {a}" in caught.value.message
    live = kube.get(ref(a))
    assert live is not None and not live["spec"].get("dependsOn"), "the refused edge is not stored"
    # an edge to somewhere else (and to a BundleDeployment not created yet) is admitted
    admitted = set_depends_on(kube, a, d)
    assert admitted["spec"]["dependsOn"] == [{"name": d}]
    # once it exists and leads back, creating it is what closes the cycle
    with pytest.raises(errors.RukpakError, match=f"{d} -> {c} -> {b} -> {a} -> {d}"):
        kube.create(bd(d, c))
    kube.create(bd(d))


def test_a_self_dependency_is_refused(kube: Kube, server: webhook.Server) -> None:
    a = unique("self")
    with pytest.raises(errors.RukpakError, match=f"closes a cycle: {a} -> {a}"):
        kube.create(bd(a, a))


def test_members_of_a_cycle_made_without_the_webhook_can_still_be_updated_and_deleted(
    kube: Kube, server: webhook.Server
) -> None:
    """A cycle written while no webhook answered (here: outside its object selector): the
    manager reports it as ``DependencyCycle``; updates that leave ``dependsOn`` alone (a
    label, a finalizer and its removal) are admitted, so its members can go."""
    a, b = unique("loop-a"), unique("loop-b")
    kube.create(bd(a, b, selected=False))
    kube.create(bd(b, a, selected=False))
    kube.merge_patch(ref(a), {"metadata": {"labels": {SELECTOR_LABEL: SUFFIX}}})
    held = kube.merge_patch(ref(a), {"metadata": {"finalizers": ["example.com/hold"]}})
    assert held["metadata"]["labels"][SELECTOR_LABEL] == SUFFIX  # now judged by the webhook
    with pytest.raises(errors.RukpakError, match=f"closes a cycle: {a} -> {b} -> {a}"):
        set_depends_on(kube, a, b, unique("other"))
    kube.delete(ref(a))
    released = kube.merge_patch(ref(a), {"metadata": {"finalizers": None}})
    assert released["metadata"].get("deletionTimestamp")
    assert kube.get(ref(a)) is None
    kube.delete(ref(b))
