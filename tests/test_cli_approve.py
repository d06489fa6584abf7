"""``rukpak approve``, ``rukpak get`` and ``rukpak version``.

Pure: when ``approve --preview-digest`` refuses (``approve.check`` on what a status holds).
Against the real kube-apiserver with our CRDs (no manager runs: the test writes the status
the manager would have written): the approval patch and its resourceVersion precondition,
``get`` in each output, and the manager's version read off its Deployment.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from provisioner.cli import approve, deployments
from provisioner.cli import main as cli
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef
from rukpak.common import errors
from tests.crd_helpers import install_crds
from tests.install_helpers import bd_v2

D1 = "sha256:" + "1" * 64
D2 = "sha256:" + "2" * 64
COMMIT = "a" * 40
IMAGE = f"registry.example/app@{D1}"


def paused(
    *,
    generation: int = 2,
    preview: Obj | None = None,
    pinned_for: int | None = 2,
    resolved: Obj | None = None,
    **status: Any,
) -> Obj:
    """A paused BundleDeployment as the manager leaves it once its preview is made."""
    annotations = {}
    if pinned_for is not None:
        annotations[approve.PIN_ANNOTATION] = json.dumps({"generation": pinned_for})
    return {
        "metadata": {"name": "app", "generation": generation, "annotations": annotations},
        "spec": {"paused": True},
        "status": {
            "resolvedSource": resolved or {"type": "image", "image": {"ref": IMAGE}},
            "preview": {"revision": "app-1234", "generation": 2, "objects": 3}
            if preview is None
            else preview,
            **status,
        },
    }


def test_the_preview_of_the_digest_asked_for_is_approved() -> None:
    assert approve.check(paused(), D1) == D1
    assert approve.check(paused(), None) == D1  # no digest: what the preview is of
    recorded = paused(preview={"revision": "app-1", "generation": 2, "digests": [D1, COMMIT]})
    assert approve.check(recorded, None) == f"{D1},{COMMIT}"  # the preview's own record
    assert approve.check(recorded, COMMIT) == f"{D1},{COMMIT}"  # several sources: all of them


def test_what_is_not_paused_has_nothing_to_approve() -> None:
    bd = paused()
    bd["spec"]["paused"] = False
    assert approve.check(bd, D2) is None


@pytest.mark.parametrize(
    ("bd", "digest", "error", "words"),
    [
        (paused(), D2, errors.FailedPrecondition,
         f"bundledeployment.core.rukpak.io/app: the preview is of {D1}, not {D2}: review that "
         "preview (see rukpak preview app) before approving it"),
        (paused(preview={}), D1, errors.FailedPrecondition, "has no preview yet"),
        (paused(preview={"error": "pull failed", "generation": 2}), D1,
         errors.FailedPrecondition, "the preview failed: pull failed"),
        (paused(generation=3), D1, errors.FailedPrecondition,
         "the preview is of generation 2, the spec is at generation 3: wait for the new preview"),
        (paused(pinned_for=1), D1, errors.FailedPrecondition,
         "the source of generation 2 is not pinned yet"),
        (paused(), "latest", errors.InvalidArgument,
         "--preview-digest 'latest' is not a digest: give sha256:<64 hex digits>"),
    ],
    ids=["another digest", "no preview", "preview failed", "older preview", "older pin",
         "not a digest"],
)  # fmt: skip
def test_a_preview_that_is_not_of_the_digest_is_not_approved(
    bd: Obj, digest: str, error: type[errors.RukpakError], words: str
) -> None:
    if bd["status"]["preview"] == {}:
        del bd["status"]["preview"]
    with pytest.raises(error) as caught:
        approve.check(bd, digest)
    assert words in caught.value.message


def test_each_kind_of_pin_names_its_digest() -> None:
    git = {"type": "git", "git": {"repository": "https://g.example/r", "ref": {"commit": COMMIT}}}
    http = {"type": "http", "http": {"url": f"https://h.example/b.tgz#sha256={'3' * 64}"}}
    several = {"resolvedSources": [{**git, "destination": "a"}, {**http, "destination": "b"}]}
    assert approve.digests_of({"resolvedSource": git}) == [COMMIT]
    assert approve.digests_of(several) == [COMMIT, "sha256:" + "3" * 64]
    assert approve.check(paused(resolved=git), COMMIT) == COMMIT


# -- against the API server ------------------------------------------------------------------


def rukpak(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.cluster
def test_approve_annotates_only_the_preview_it_was_told_of(
    kube: Kube, kube_apiserver: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    install_crds(kube)
    kc = ["--kubeconfig", str(kube_apiserver.kubeconfig)]
    name = f"approve-{uuid.uuid4().hex[:6]}"
    created = kube.create(bd_v2(name, "registry.example/app:v1", paused=True))
    generation = created["metadata"]["generation"]
    pin = json.dumps({"generation": generation, "at": "2026-11-28T03:00:00Z"})
    kube.merge_patch(
        deployments.ref(name), {"metadata": {"annotations": {approve.PIN_ANNOTATION: pin}}}
    )
    kube.merge_patch_status(
        deployments.ref(name),
        {
            "status": {
                "resolvedSource": {"type": "image", "image": {"ref": IMAGE}},
                "preview": {"revision": f"{name}-abc", "generation": generation, "objects": 1},
            }
        },
    )

    code, out, err = rukpak(capsys, "get", name, "-o", "json", *kc)
    assert code == 0, err
    assert json.loads(out)["status"]["preview"]["generation"] == generation
    code, out, _ = rukpak(capsys, "get", "-o", "name", *kc)
    assert f"bundledeployment.core.rukpak.io/{name}" in out.splitlines()
    code, out, _ = rukpak(capsys, "get", name, "-o", "wide", *kc)
    assert out.splitlines()[0].split()[-4:] == ["PROVISIONER", "ACTIVE", "BUNDLE", "PAUSED"]
    assert out.splitlines()[1].split()[0] == name and out.splitlines()[1].endswith("true")

    code, _, err = rukpak(capsys, "approve", name, "--preview-digest", D2, *kc)
    assert code == 1 and f"the preview is of {D1}, not {D2}" in err
    annotations = kube.get(deployments.ref(name))["metadata"].get("annotations")  # type: ignore[index]
    assert approve.APPROVED_ANNOTATION not in annotations

    code, out, err = rukpak(capsys, "approve", name, "--preview-digest", D1, *kc)
    assert (code, out) == (0, f"bundledeployment.core.rukpak.io/{name} approved: {D1}\n"), err
    approved = kube.get(deployments.ref(name))
    assert approved["spec"]["paused"] is True  # type: ignore[index]
    assert approved["metadata"]["annotations"][approve.APPROVED_ANNOTATION] == D1  # type: ignore[index]
    code, out, _ = rukpak(capsys, "approve", name, *kc)  # twice is fine: the same approval
    assert (code, out) == (0, f"bundledeployment.core.rukpak.io/{name} approved: {D1}\n")
    kube.merge_patch(deployments.ref(name), {"spec": {"paused": False}})
    code, out, _ = rukpak(capsys, "approve", name, *kc)
    assert code == 0 and "is not paused: nothing to approve" in out


@pytest.mark.cluster
def test_approve_refuses_a_spec_that_changed_after_it_was_read(
    kube: Kube, kube_apiserver: Any, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    install_crds(kube)
    name = f"approve-{uuid.uuid4().hex[:6]}"
    kube.create(bd_v2(name, "registry.example/app:v1", paused=True))
    stale = kube.get(deployments.ref(name))
    assert stale is not None
    stale["status"] = {
        "preview": {"generation": stale["metadata"]["generation"]},
        "resolvedSource": {"type": "image", "image": {"ref": IMAGE}},
    }
    stale["metadata"].setdefault("annotations", {})[approve.PIN_ANNOTATION] = json.dumps(
        {"generation": stale["metadata"]["generation"]})  # fmt: skip
    kube.merge_patch(
        deployments.ref(name), {"spec": {"source": {"image": {"ref": "registry.example/app:v2"}}}}
    )
    monkeypatch.setattr(deployments, "get", lambda _kube, _name: stale)
    code, _, err = rukpak(capsys, "approve", name, "--kubeconfig", str(kube_apiserver.kubeconfig))
    assert code == 1 and f"bundledeployment.core.rukpak.io/{name} changed while it was" in err
    live = kube.get(deployments.ref(name))
    assert approve.APPROVED_ANNOTATION not in (live["metadata"].get("annotations") or {})  # type: ignore[index]


@pytest.mark.cluster
def test_version_reads_the_managers_deployment(
    kube: Kube, kube_apiserver: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = f"v-{uuid.uuid4().hex[:6]}"
    kc = ["--kubeconfig", str(kube_apiserver.kubeconfig), "--system-namespace", ns]
    code, out, err = rukpak(capsys, "version", "-o", "json", *kc)
    assert code == 0 and "managerVersion" not in json.loads(out)
    assert f"no manager in this cluster (no Deployment {ns}/rukpak-manager)" in err

    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    labels = {"app.kubernetes.io/name": "rukpak-manager"}
    kube.create(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "rukpak-manager", "namespace": ns},
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "containers": [
                            {"name": "manager", "image": "registry.example/rukpak:v0.3.1"}
                        ]
                    },
                },
            },
        }
    )
    code, out, err = rukpak(capsys, "version", "-o", "yaml", *kc)
    assert code == 0, err
    assert "managerVersion:\n  version: v0.3.1\n  image: registry.example/rukpak:v0.3.1" in out
    ref = ObjectRef("apps", "v1", "Deployment", ns, "rukpak-manager")
    kube.merge_patch(ref, {"metadata": {"labels": {"app.kubernetes.io/version": "0.3.1-rc.1"}}})
    code, out, _ = rukpak(capsys, "version", *kc)
    assert out.splitlines()[1] == (
        "Manager Version: 0.3.1-rc.1 (image registry.example/rukpak:v0.3.1)"
    )
    kube.delete(ObjectRef("", "v1", "Namespace", "", ns))


def test_an_upgrade_held_for_its_new_permissions_is_approved_unpaused() -> None:
    held = paused(preview={"revision": "app-2", "generation": 2, "digests": [D1]})
    held["spec"]["paused"] = False
    assert approve.check(held, D1) is None  # nothing held: nothing to approve
    held["status"]["conditions"] = [
        {"type": "Approved", "status": "False", "reason": "EscalationNeedsApproval"}
    ]
    assert approve.check(held, D1) == D1


def test_a_preview_the_manager_binds_is_approved_by_its_digests_whatever_the_generation() -> None:
    bound = {"revision": "app-1", "generation": 1, "digests": [D1], "specHash": "0" * 16}
    assert approve.check(paused(generation=3, pinned_for=1, preview=bound), D1) == D1
    moved = paused(preview={**bound, "digests": [D2]})  # the pin in the status is D1
    with pytest.raises(errors.FailedPrecondition) as caught:
        approve.check(moved, D2)
    assert f"the preview is of {D2}, the source now pins {D1}: wait for its preview" in (
        caught.value.message
    )
