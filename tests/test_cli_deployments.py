"""``rukpak history|rollback`` on what a BundleDeployment's status holds, pure: which
revision a rollback goes to, why one cannot, and the history table. Against the local
kubelet (a rollback with the registry stopped): ``test_e2e_lifecycle``."""

from __future__ import annotations

from typing import Any

import pytest

from provisioner.cli import deployments
from provisioner.engine.objects import Obj
from rukpak.common import errors

D1 = "registry.example/app@sha256:" + "1" * 64


def kept(number: int, outcome: str = "Installed") -> Obj:
    return {
        "revision": number,
        "name": f"app-{number}",
        "source": {"type": "image", "image": {"ref": D1}},
        "generation": number,
        "time": "2026-11-25T12:00:00Z",
        "outcome": outcome,
        "objects": 3,
    }


def bd(*, annotations: dict[str, str] | None = None, **status: Any) -> Obj:
    return {"metadata": {"name": "app", "annotations": annotations or {}}, "status": status}


def test_a_rollback_goes_to_the_previous_revision_unless_told() -> None:
    the_bd = bd(revisions=[kept(1), kept(2)], installedRevision=2, previousRevision=1)
    assert deployments.choose(the_bd, None).number == 1
    assert deployments.choose(the_bd, 2).number == 2


@pytest.mark.parametrize(
    ("the_bd", "wanted", "error", "words"),
    [
        (bd(revisions=[kept(1)], installedRevision=1), None, errors.FailedPrecondition,
         "no previous revision: name one with --to-revision"),
        (bd(revisions=[kept(1), kept(2)], previousRevision=1), 7, errors.NotFound,
         "revision 7 is not kept (kept: 1, 2)"),
        (bd(revisions="junk", previousRevision=1), None, errors.NotFound, "(kept: none)"),
        (bd(annotations={deployments.V1ALPHA1_MADE: "{}"}, revisions=[kept(1)]), 1,
         errors.FailedPrecondition, "was created as v1alpha1"),
    ],
    ids=["no previous", "not kept", "unreadable history", "made as v1alpha1"],
)  # fmt: skip
def test_a_rollback_that_cannot_be_says_why(
    the_bd: Obj, wanted: int | None, error: type[errors.RukpakError], words: str
) -> None:
    with pytest.raises(error) as caught:
        deployments.choose(the_bd, wanted)
    assert words in caught.value.message


def test_the_history_marks_the_installed_and_the_previous_revision() -> None:
    table = deployments.history_table(
        bd(revisions=[kept(1), kept(2, "Failed")], installedRevision=1, previousRevision=None)
    ).splitlines()
    assert table[0] == "bundledeployment.core.rukpak.io/app"
    assert table[1].split() == ["REVISION", "OUTCOME", "OBJECTS", "GENERATION", "TIME", "SOURCE"]
    assert table[2].split()[:2] == ["1*", "Installed"] and table[2].endswith(D1)
    assert table[3].split()[:2] == ["2", "Failed"]
