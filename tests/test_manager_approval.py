"""Approval bound to what was reviewed, against a real kube-apiserver and a real registry.

The manager's controller runs in-process; a tag of the ``registry`` fixture is moved
between a paused v1alpha2 BundleDeployment's preview and its approval. No kubelet runs
here: the test plays the kubelet's part for the preview run (it writes the pod's status
with the summary ``instance --preview`` would leave) and reads what the manager asks the
instance run to mount, which is what would be installed. The same flow on the local
kubelet, from deploy/, is in ``test_e2e_lifecycle`` (the paused bundle granting secrets).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from provisioner.cli import main as cli
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef, condition
from provisioner.manager import controller, model
from provisioner.manager.acting import actuate
from provisioner.manager.planning import approval, generate
from rukpak.oci import client as oci_client
from rukpak.oci.reference import Reference
from tests import e2e_helpers as e2e
from tests import manager_harness as harness
from tests.bundles import configmap, namespace, write_bundle
from tests.crd_helpers import install_crds
from tests.install_helpers import bd_v2
from tests.polling import eventually

pytestmark = pytest.mark.cluster

SUFFIX = uuid.uuid4().hex[:6]
SYSTEM_NS = f"rukpak-approval-{SUFFIX}"


@pytest.fixture(scope="module")
def running(kube: Kube) -> Iterator[controller.Controller]:
    install_crds(kube)
    with harness.running_controller(kube, SYSTEM_NS) as ctl:
        yield ctl


def push(registry: Any, root: Path, ref: str, greeting: str) -> str:
    """Push a bundle of one ConfigMap saying ``greeting`` as ``ref``; its digest."""
    write_bundle(
        root,
        {"app.yaml": [namespace("approval"), configmap("hello", "approval", greeting=greeting)]},
    )
    e2e.push_bundle(root, ref)
    return str(oci_client.RegistryClient(retries=0).resolve(Reference.parse(ref)).digest)


def bd_ref(name: str) -> ObjectRef:
    return actuate.bd_ref(name, model.API_VERSION_V2)


def live(kube: Kube, name: str) -> Obj:
    found = kube.get(bd_ref(name))
    assert found is not None
    return found


def pods_of(kube: Kube, name: str, *, preview: bool) -> list[Obj]:
    return [
        p
        for p in harness.pods_of(kube, SYSTEM_NS, name)
        if ((p["metadata"].get("annotations") or {}).get(generate.PREVIEW_ANNOTATION) == "true")
        == preview
    ]


def finish_preview(kube: Kube, name: str, digest: str) -> Obj:
    """Play the kubelet: the preview run of ``digest`` ends with a summary; the preview the
    manager then writes into the status."""
    pod = eventually(
        lambda: next(
            (p for p in pods_of(kube, name, preview=True) if harness.mounted(p).endswith(digest)),
            None,
        ),
        timeout=30,
        what=f"the preview run of {digest}",
    )
    summary = {"objects": 2, "clusterScoped": 1, "escalations": []}
    ref = ObjectRef("", "v1", "Pod", SYSTEM_NS, pod["metadata"]["name"])
    harness.end_container(kube, ref, "instance", message=json.dumps(summary))
    return eventually(
        lambda: (
            p
            if (p := (live(kube, name).get("status") or {}).get("preview") or {}).get("pod")
            == pod["metadata"]["name"]
            else None
        ),
        timeout=30,
        what="the preview in the status",
    )


def test_unpausing_installs_the_digest_the_preview_reviewed_not_where_the_tag_moved(
    kube: Kube, running: controller.Controller, registry: Any, tmp_path: Path
) -> None:
    name = f"bound-{SUFFIX}"
    ref = f"{registry.host}/approval-{SUFFIX}/app:stable"
    reviewed = push(registry, tmp_path / "a", ref, "reviewed")
    kube.create(bd_v2(name, ref, paused=True))
    finish_preview(kube, name, reviewed)
    assert pods_of(kube, name, preview=False) == []  # paused: nothing installs
    moved = push(registry, tmp_path / "b", ref, "never reviewed")
    assert moved != reviewed

    kube.merge_patch(bd_ref(name), {"spec": {"paused": False}})
    run = eventually(
        lambda: next(iter(pods_of(kube, name, preview=False)), None),
        timeout=30,
        what="the instance run once approved",
    )
    assert harness.mounted(run) == f"{ref.rsplit(':', 1)[0]}@{reviewed}"
    kube.delete(bd_ref(name))


def approved_cond(kube: Kube, name: str) -> tuple[str, str, str] | None:
    found = condition(live(kube, name), approval.APPROVED)
    return None if found is None else (found["status"], found["reason"], found["message"])


def test_an_approval_of_a_digest_the_tag_moved_from_installs_nothing_until_the_new_preview_is(
    kube: Kube,
    kube_apiserver: Any,
    running: controller.Controller,
    registry: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    name = f"moved-{SUFFIX}"
    ref = f"{registry.host}/approval-{SUFFIX}/app:moving"
    first = push(registry, tmp_path / "a", ref, "first")
    kube.create(bd_v2(name, ref, paused=True, pollInterval="1s"))
    finish_preview(kube, name, first)
    waiting = eventually(lambda: approved_cond(kube, name), timeout=30, what="Approved")
    assert waiting[:2] == ("False", "AwaitingApproval"), waiting
    assert f"rukpak approve {name} --preview-digest {first}" in waiting[2]

    second = push(registry, tmp_path / "b", ref, "second")  # the tag moves, polled
    finish_preview(kube, name, second)
    # an approval of what the first preview showed, written once the source moved on
    kube.merge_patch(
        bd_ref(name), {"metadata": {"annotations": {approval.APPROVED_ANNOTATION: first}}}
    )
    moved = eventually(
        lambda: c if (c := approved_cond(kube, name)) and c[1] == "PreviewChanged" else None,
        timeout=30,
        what="Approved=False PreviewChanged",
    )
    assert moved[2].startswith(f"approved {first}, but the source now pins {second}"), moved
    assert pods_of(kube, name, preview=False) == []  # nothing installs
    assert live(kube, name)["spec"]["paused"] is True

    kc = ["--kubeconfig", str(kube_apiserver.kubeconfig)]
    code = cli.main(["approve", name, "--preview-digest", second, *kc])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out == f"bundledeployment.core.rukpak.io/{name} approved: {second}\n"
    run = eventually(
        lambda: next(iter(pods_of(kube, name, preview=False)), None),
        timeout=30,
        what="the instance run of the approved digest",
    )
    assert harness.mounted(run) == f"{ref.rsplit(':', 1)[0]}@{second}"
    done = eventually(
        lambda: c if (c := approved_cond(kube, name)) and c[0] == "True" else None,
        timeout=30,
        what="Approved=True",
    )
    assert done == (
        "True",
        "Approved",
        f"{second} approved ({approval.APPROVED_ANNOTATION}): installing it",
    )
    kube.delete(bd_ref(name))
