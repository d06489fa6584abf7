"""The unpack pod's side (``rukpak-provisioner unpack``) and the pure Bundle planner.

``unpack.validate`` runs on real directories; the planner gets the Bundle and
unpack pod bodies the API server and kubelet would show. Upstream RukPak's
phases, reasons and plain+v0 messages are asserted word for word.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from provisioner import __main__ as provisioner_main
from provisioner.engine.bundle import words
from provisioner.engine.objects import Obj
from provisioner.instance import unpack
from provisioner.manager import model
from provisioner.manager.planning import bundleplan

SETTINGS = model.Settings(image="registry.example/rukpak:v1", system_namespace="rukpak-system")
DIGEST = "registry.example/hello@sha256:" + "a" * 64
NOW = "2026-01-01T00:00:00Z"

CONFIGMAP = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: x\n"


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


# -- validate: upstream's words ---------------------------------------------------------------


def test_a_bundle_without_manifests_gets_upstreams_message(tmp_path: Path) -> None:
    result = unpack.validate(tree(tmp_path, {"README": "hi"}))
    assert result.error == (
        "get objects from bundle manifests: readdir manifests: file does not exist"
    )


def test_an_empty_manifests_directory_gets_upstreams_message(tmp_path: Path) -> None:
    (tmp_path / "manifests").mkdir()
    result = unpack.validate(tmp_path)
    assert result.error == (
        "invalid bundle: found zero objects: plain+v0 bundles are required to contain at "
        "least one object"
    )


def test_a_manifests_directory_of_empty_documents_has_zero_objects(tmp_path: Path) -> None:
    result = unpack.validate(tree(tmp_path, {"manifests/a.yaml": "---\n---\n"}))
    assert "found zero objects" in result.error


def test_a_subdirectory_gets_upstreams_message(tmp_path: Path) -> None:
    tree(tmp_path, {"manifests/a.yaml": CONFIGMAP.format(name="a"), "manifests/sub/b.yaml": ""})
    result = unpack.validate(tmp_path)
    assert result.error == (
        "get objects from bundle manifests: subdirectories are not allowed within the "
        '"manifests" directory of the bundle image filesystem: found "manifests/sub"'
    )


def test_other_errors_name_the_file_and_document(tmp_path: Path) -> None:
    tree(tmp_path, {"manifests/a.yaml": CONFIGMAP.format(name="a") + "---\nkind: [\n"})
    result = unpack.validate(tmp_path)
    assert result.error.startswith("get objects from bundle manifests: manifests/a.yaml document 2")


def test_a_registry_bundle_reports_upstreams_conversion_words(tmp_path: Path) -> None:
    tree(tmp_path, {"manifests/a.yaml": CONFIGMAP.format(name="a")})
    result = unpack.validate(tmp_path, format="registry+v1")
    assert result.error.startswith("convert registry+v1 bundle to plain+v0 bundle: missing;")


def test_a_valid_bundle_reports_its_kinds(tmp_path: Path) -> None:
    ns = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: x\n"
    tree(
        tmp_path,
        {
            "manifests/00_ns.yaml": ns,
            "manifests/10_cm.yaml": CONFIGMAP.format(name="a")
            + "---\n"
            + CONFIGMAP.format(name="b"),
        },
    )
    result = unpack.validate(tmp_path)
    assert result.ok
    assert result.kinds == {"ConfigMap": 2, "Namespace": 1}
    assert result.summary() == "3 objects (ConfigMap 2, Namespace 1)"
    assert unpack.Result.from_json(result.to_json()) == result


def test_the_unpack_command_writes_the_termination_log_and_exit_status(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    bundle = tree(tmp_path / "b", {"manifests/a.yaml": CONFIGMAP.format(name="a")})
    argv = ["unpack", "--bundle-dir", str(bundle), "--termination-log", str(log)]
    assert provisioner_main.main(argv) == 0
    assert json.loads(log.read_text()) == {"objects": 1, "kinds": {"ConfigMap": 1}}
    (bundle / "manifests" / "a.yaml").unlink()
    assert provisioner_main.main(argv) == 1
    assert "found zero objects" in json.loads(log.read_text())["error"]


def test_a_long_error_still_fits_a_termination_message() -> None:
    text = unpack.Result(error="x" * 10_000).to_json()
    assert len(text.encode()) < 4096


# -- the Bundle planner -----------------------------------------------------------------------


def bundle(*, status: Obj | None = None, source: Obj | None = None) -> Obj:
    return {
        "apiVersion": model.API_VERSION,
        "kind": model.BUNDLE,
        "metadata": {"name": "hello-1", "uid": "u1", "generation": 1},
        "spec": {
            "provisionerClassName": model.PLAIN_CLASS,
            "source": source or {"type": "image", "image": {"ref": "registry.example/hello:v1"}},
        },
        "status": status or {},
    }


RESOLVED = {"phase": "Pending", "resolvedSource": {"type": "image", "image": {"ref": DIGEST}}}


def pod(phase: str, **container: Any) -> Obj:
    return {
        "metadata": {"name": "hello-1", "namespace": "rukpak-system", "uid": "p1"},
        "status": {
            "phase": phase,
            "containerStatuses": [{"name": "unpack", **container}] if container else [],
        },
    }


def run(b: Obj, **observed: Any) -> list[bundleplan.Action]:
    return bundleplan.plan(b, bundleplan.Observed(now=NOW, **observed), settings=SETTINGS)


def written(actions: list[bundleplan.Action]) -> tuple[str, str, str, str]:
    (write,) = [a for a in actions if isinstance(a, bundleplan.WriteStatus)]
    (cond,) = write.status["conditions"]
    return write.status["phase"], cond["status"], cond["reason"], cond["message"]


def test_an_unresolved_bundle_is_resolved_first() -> None:
    (action,) = run(bundle())
    assert isinstance(action, bundleplan.Resolve)
    assert (action.name, action.ref) == ("hello-1", "registry.example/hello:v1")
    assert action.source == {"type": "image", "image": {"ref": "registry.example/hello:v1"}}


def test_a_resolved_bundle_gets_an_unpack_pod_mounting_the_digest() -> None:
    actions = run(bundle(status=RESOLVED))
    (create,) = [a for a in actions if isinstance(a, bundleplan.CreatePod)]
    spec = create.pod["spec"]
    assert create.pod["metadata"]["namespace"] == "rukpak-system"
    assert create.pod["metadata"]["labels"][model.OWNER_KIND_LABEL] == "Bundle"
    assert create.pod["metadata"]["labels"][model.OWNER_NAME_LABEL] == "hello-1"
    assert create.pod["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert spec["restartPolicy"] == "Never"
    assert spec["automountServiceAccountToken"] is False
    (volume,) = spec["volumes"]
    assert volume["csi"]["driver"] == "csi.rukpak.io"
    assert volume["csi"]["volumeAttributes"]["image"] == DIGEST
    (container,) = spec["containers"]
    assert container["command"][1:] == [
        "unpack",
        "--bundle-dir",
        "/bundle",
        "--format",
        "plain+v0",
    ]
    assert written(actions)[:3] == ("Pending", "False", "UnpackPending")


def test_a_pending_pod_reports_the_mount_failure() -> None:
    failure = 'MountVolume.SetUp failed for volume "bundle" : rpc error: code = NotFound desc = x'
    actions = run(bundle(status=RESOLVED), pod=pod("Pending"), mount_failures=("old", failure))
    assert written(actions) == ("Pending", "False", "UnpackPending", failure)
    assert [a.after for a in actions if isinstance(a, bundleplan.Requeue)] == [
        bundleplan.PENDING_POLL
    ]


def test_a_running_pod_is_unpacking() -> None:
    actions = run(bundle(status=RESOLVED), pod=pod("Running", state={"running": {}}))
    assert written(actions)[:3] == ("Unpacking", "False", "Unpacking")


def test_a_succeeded_pod_makes_the_bundle_unpacked_and_goes() -> None:
    result = unpack.Result(kinds={"ConfigMap": 2}).to_json()
    done = pod("Succeeded", state={"terminated": {"exitCode": 0, "message": result}})
    actions = run(bundle(status=RESOLVED), pod=done)
    assert written(actions) == (
        "Unpacked",
        "True",
        "UnpackSuccessful",
        "Successfully unpacked the image Bundle: 2 objects (ConfigMap 2)",
    )
    assert actions[-1] == bundleplan.DeletePod("rukpak-system", "hello-1")
    (write,) = [a for a in actions if isinstance(a, bundleplan.WriteStatus)]
    assert write.status["resolvedSource"]["image"]["ref"] == DIGEST


def test_a_failed_pod_makes_the_bundle_failing_with_the_loader_message() -> None:
    result = unpack.Result(error=words.ZERO_OBJECTS).to_json()
    done = pod("Failed", state={"terminated": {"exitCode": 1, "message": result}})
    actions = run(bundle(status=RESOLVED), pod=done)
    assert written(actions) == ("Failing", "False", "UnpackFailed", words.ZERO_OBJECTS)
    assert actions[-1] == bundleplan.DeletePod("rukpak-system", "hello-1")
    events = [a for a in actions if isinstance(a, bundleplan.RecordEvent)]
    assert [(e.type, e.reason) for e in events] == [("Warning", "UnpackFailed")]


@pytest.mark.parametrize("phase", ["Unpacked", "Failing"])
def test_a_final_bundle_makes_no_pod_and_removes_a_leftover(phase: str) -> None:
    final = bundle(
        status={**RESOLVED, "phase": phase, "conditions": [{"type": "Unpacked", "status": "x"}]}
    )
    assert run(final) == []
    assert run(final, pod=pod("Running")) == [bundleplan.DeletePod("rukpak-system", "hello-1")]


def test_an_unsupported_source_fails_in_upstreams_words() -> None:
    upload = {"type": "upload", "upload": {}}
    actions = run(bundle(source=upload))
    assert written(actions) == (
        "Failing",
        "False",
        "UnpackFailed",
        'source bundle content: bundle source type "upload" not supported',
    )


def test_an_unchanged_status_is_not_written_again() -> None:
    first = run(bundle(status=RESOLVED), pod=pod("Running", state={"running": {}}))
    (write,) = [a for a in first if isinstance(a, bundleplan.WriteStatus)]
    again = run(bundle(status=write.status), pod=pod("Running", state={"running": {}}))
    assert again == []


def test_only_our_provisioner_classes_are_handled() -> None:
    other = bundle()
    other["spec"]["provisionerClassName"] = "core-rukpak-io-helm"
    assert not bundleplan.handles(other)
    assert bundleplan.handles(bundle())
    registry = bundle()
    registry["spec"]["provisionerClassName"] = model.REGISTRY_CLASS
    assert bundleplan.handles(registry)


def test_a_registry_bundle_is_unpacked_with_the_registry_v1_loader() -> None:
    registry = bundle(status=RESOLVED)
    registry["spec"]["provisionerClassName"] = model.REGISTRY_CLASS
    (create,) = [a for a in run(registry) if isinstance(a, bundleplan.CreatePod)]
    (container,) = create.pod["spec"]["containers"]
    assert container["command"][-2:] == ["--format", "registry+v1"]


def test_the_registry_fixture_validates_as_registry_v1_not_plain() -> None:
    root = Path(__file__).parent / "data" / "registry-v1" / "cache-operator"
    result = unpack.validate(root, format="registry+v1")
    assert result.ok, result.error
    assert result.kinds["CustomResourceDefinition"] >= 1
    assert result.kinds["Deployment"] >= 1
