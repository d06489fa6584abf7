"""How a standing provisioner turns a run's one content volume into a directory
(``provisioner.standing.worker.Standing.content``), pure: ConfigMap items written as kubelet
projects them, hostile item paths refused, a missing ConfigMap or key named, and a CSI
volume handed to the store client in a pod volume's terms with its Secret's data decoded.
The store volume itself is proven against the real node plugin in
``tests/test_csi_storevolume.py`` and end to end in ``tests/test_e2e_sources.py``.
"""

from __future__ import annotations

import base64
import threading
from pathlib import Path
from typing import Any

import pytest

from provisioner.engine.objects import ObjectRef
from provisioner.manager import model
from provisioner.manager.model import Settings
from provisioner.manager.planning import generate, sources
from provisioner.standing import worker as standing_worker
from provisioner.standing.worker import Standing
from rukpak.common import errors


class FakeKube:
    def __init__(self, objects: dict[tuple[str, str], dict[str, Any]]) -> None:
        self.objects = objects

    def get(self, ref: ObjectRef) -> dict[str, Any] | None:
        return self.objects.get((ref.kind, ref.name))


class FakeStore:
    """Answers every request with ``root``, or with ``root/<n>`` (made) when ``several``."""

    def __init__(self, root: Path, *, several: bool = False) -> None:
        self.root = root
        self.several = several
        self.asked: list[tuple[dict[str, str], dict[str, str]]] = []

    def fetch_volume(self, attributes: dict[str, str], secrets: dict[str, str]) -> Path:
        self.asked.append((attributes, secrets))
        if not self.several:
            return self.root
        path = self.root / str(len(self.asked))
        (path / "manifests").mkdir(parents=True)
        (path / "manifests" / "which").write_text(attributes.get("image") or attributes["git"])
        return path


def standing(objects: dict[tuple[str, str], dict[str, Any]], root: Path) -> Standing:
    worker = Standing.__new__(Standing)  # only content() is exercised: no informer
    worker.kube = FakeKube(objects)  # type: ignore[assignment]
    worker.store = FakeStore(root)  # type: ignore[assignment]
    worker.namespace = "rukpak-system"
    return worker


def projected(*items: tuple[str, str, str]) -> dict[str, Any]:
    sources: dict[str, list[dict[str, str]]] = {}
    for name, key, path in items:
        sources.setdefault(name, []).append({"key": key, "path": path})
    volume = {
        "name": "bundle",
        "projected": {
            "sources": [{"configMap": {"name": n, "items": i}} for n, i in sources.items()]
        },
    }
    return {"spec": {"volumes": [volume]}}


CONFIGMAP = {
    "data": {"cm.yaml": "kind: ConfigMap\n"},
    "binaryData": {"raw.bin": base64.b64encode(b"\x00\x01").decode()},
}


def test_configmap_items_are_written_where_kubelet_would_project_them(tmp_path: Path) -> None:
    worker = standing({("ConfigMap", "m"): CONFIGMAP}, tmp_path)
    pod = projected(("m", "cm.yaml", "manifests/cm.yaml"), ("m", "raw.bin", "extra/raw.bin"))
    with worker.content(pod) as root:
        assert (root / "manifests" / "cm.yaml").read_text() == "kind: ConfigMap\n"
        assert (root / "extra" / "raw.bin").read_bytes() == b"\x00\x01"
        kept = root
    assert not kept.exists(), "the projected copy is removed after the run"


@pytest.mark.parametrize("path", ["../escape.yaml", "/etc/passwd", "manifests/../../x", ""])
def test_an_item_path_outside_the_bundle_is_refused_and_nothing_is_written(
    tmp_path: Path, path: str
) -> None:
    worker = standing({("ConfigMap", "m"): CONFIGMAP}, tmp_path)
    with (
        pytest.raises(errors.InvalidArgument, match="is outside"),
        worker.content(projected(("m", "cm.yaml", path))),
    ):
        pass
    assert not (tmp_path.parent / "escape.yaml").exists()


def test_a_missing_configmap_or_key_is_named(tmp_path: Path) -> None:
    worker = standing({("ConfigMap", "m"): CONFIGMAP}, tmp_path)
    with (
        pytest.raises(errors.NotFound, match="ConfigMap rukpak-system/gone not found"),
        worker.content(projected(("gone", "cm.yaml", "manifests/cm.yaml"))),
    ):
        pass
    with (
        pytest.raises(errors.NotFound, match=r"has no key 'other\.yaml'"),
        worker.content(projected(("m", "other.yaml", "manifests/o.yaml"))),
    ):
        pass


def test_a_csi_volume_is_asked_of_the_store_with_its_secret_decoded(tmp_path: Path) -> None:
    secret = {"data": {"username": base64.b64encode(b"u").decode(), "password": "cA=="}}
    worker = standing({("Secret", "auth"): secret}, tmp_path)
    attributes = {"git": "https://git.example.com/r", "commit": "a" * 40}
    volume = {
        "name": "bundle",
        "csi": {
            "driver": "csi.rukpak.io",
            "volumeAttributes": attributes,
            "nodePublishSecretRef": {"name": "auth"},
        },
    }
    with worker.content({"spec": {"volumes": [volume]}}) as root:
        assert root == tmp_path
    assert worker.store.asked == [(attributes, {"username": "u", "password": "p"})]  # type: ignore[attr-defined]


def test_a_volume_of_another_driver_or_several_volumes_is_refused(tmp_path: Path) -> None:
    worker = standing({}, tmp_path)
    other = {"name": "bundle", "csi": {"driver": "other.example.com", "volumeAttributes": {}}}
    with (
        pytest.raises(errors.InvalidArgument, match="no CSI or ConfigMap volume"),
        worker.content({"spec": {"volumes": [other]}}),
    ):
        pass
    with (
        pytest.raises(errors.InvalidArgument, match="not one volume"),
        worker.content({"spec": {"volumes": [other, other]}}),
    ):
        pass


def test_several_sources_appear_at_their_destinations_and_the_instance_is_told_each(
    tmp_path: Path,
) -> None:
    image = {"type": "image", "image": {"ref": f"r.example.com/a@sha256:{'d' * 64}"}}
    repository = "https://g.example/r"
    git = {"type": "git", "git": {"repository": repository, "ref": {"commit": "a" * 40}}}
    resolved = {
        "type": sources.MULTI,
        "sources": [{**image, "destination": "app"}, {**git, "destination": "extra/git"}],
    }
    bd = {
        "apiVersion": "core.rukpak.io/v1alpha2",
        "kind": "BundleDeployment",
        "metadata": {"name": "hello", "uid": "u-1", "generation": 1},
        "spec": {"installNamespace": "hello", "provisionerClassName": model.PLAIN_CLASS},
    }
    pod = generate.instance_run_pod(bd, "rev", resolved, Settings(image="rukpak:test"), 0)
    worker = standing({}, tmp_path / "store")
    worker.store = FakeStore(tmp_path / "store", several=True)  # type: ignore[assignment]
    args = standing_worker.run_args(pod)
    with worker.content(pod, str(args.bundle_dir)) as root:
        assert (root / "app" / "manifests" / "which").read_text().startswith("r.example.com/a@")
        assert (root / "extra" / "git" / "manifests" / "which").read_text() == repository
        dirs = [root / Path(d).relative_to(args.bundle_dir) for d in args.source_dir]
        assert dirs == [root / "app", root / "extra" / "git"]
    assert len(worker.store.asked) == 2  # type: ignore[attr-defined]


def test_a_source_mounted_outside_the_bundle_directory_is_refused(tmp_path: Path) -> None:
    volume = {"name": "source-0", "csi": {"driver": "csi.rukpak.io", "volumeAttributes": {
        "git": "https://g.example/r", "commit": "a" * 40}}}  # fmt: skip
    pod = {
        "spec": {
            "volumes": [{"name": "bundle", "emptyDir": {}}, volume],
            "containers": [{"volumeMounts": [{"name": "source-0", "mountPath": "/etc"}]}],
        }
    }
    worker = standing({}, tmp_path)
    with (
        pytest.raises(errors.InvalidArgument, match="not mounted under /bundle"),
        worker.content(pod),
    ):
        pass


class RefusingStore:
    def fetch_volume(self, attributes: dict[str, str], secrets: dict[str, str]) -> Path:
        raise errors.NotFound(f"manifest {attributes['image']} not found")


def test_content_the_store_refuses_is_named_in_kubelets_failedmount_words(tmp_path: Path) -> None:
    worker = standing({}, tmp_path)
    worker.store = RefusingStore()  # type: ignore[assignment]
    image = "registry.example.com/hello@sha256:" + "0" * 64
    volume = {
        "name": "bundle",
        "csi": {"driver": "csi.rukpak.io", "volumeAttributes": {"image": image}},
    }
    with (
        pytest.raises(standing_worker.Unserved) as refused,
        worker.content({"spec": {"volumes": [volume]}}),
    ):
        pass
    assert refused.value.message == (
        'MountVolume.SetUp failed for volume "bundle" : rpc error: code = NotFound desc = '
        f"the node store could not serve {image}: manifest {image} not found"
    )


class PatchingKube(FakeKube):
    def __init__(self) -> None:
        super().__init__({})
        self.patched: list[dict[str, Any]] = []

    def merge_patch(self, ref: ObjectRef, patch: dict[str, Any]) -> dict[str, Any]:
        self.patched.append(patch)
        return {}


def test_a_stopping_provisioner_claims_no_new_run(tmp_path: Path) -> None:
    worker = standing({}, tmp_path)
    kube = worker.kube = PatchingKube()  # type: ignore[assignment]
    worker.stopping = threading.Event()
    worker.stopping.set()
    cm = {"metadata": {"name": "run-1", "resourceVersion": "3", "annotations": {}}}
    assert worker.take(cm) is False
    assert kube.patched == [], "left Pending for a provisioner that goes on"
