"""ConfigMap sources, and the pinning of every source type, on a real kube-apiserver.

The manager's resolution (``provisioner.manager.resolution``) checks the listed
ConfigMaps as upstream does (present, immutable, no two files at one path) and
records their keys; ``actuate.resolve_bundle`` writes a Bundle's
``status.resolvedSource`` (accepted unchanged by our CRD's schema, in upstream's
shapes) or makes the Bundle Failing with a message naming what to fix; the unpack
pod then gets a projected volume of exactly those keys under each ``path``.
"""

from __future__ import annotations

import contextlib
import hashlib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef
from provisioner.manager import model, resolution
from provisioner.manager.acting import actuate
from provisioner.manager.model import Settings
from provisioner.manager.planning import bundleplan, sources
from rukpak.common import errors
from tests import plan_helpers
from tests.crd_helpers import install_crds
from tests.source_servers import PASSWORD, USERNAME, SourceServer, make_repo, serving, tarball

pytestmark = pytest.mark.cluster

NS = f"rukpak-src-{uuid.uuid4().hex[:6]}"
CM = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n"


@pytest.fixture(scope="module", autouse=True)
def system(kube: Kube) -> Iterator[None]:
    install_crds(kube)
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    yield
    kube.delete(ObjectRef("", "v1", "Namespace", "", NS))


def configmap(kube: Kube, name: str, data: dict[str, str], *, immutable: bool = True) -> None:
    body: Obj = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": NS},
        "data": data,
    }
    if immutable:
        body["immutable"] = True
    kube.create(body)


def secret(kube: Kube, name: str) -> None:
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": NS},
            "stringData": {"username": USERNAME, "password": PASSWORD},
        }
    )


def bundle(kube: Kube, source: Obj) -> Obj:
    return kube.create(
        {
            "apiVersion": model.API_VERSION,
            "kind": model.BUNDLE,
            "metadata": {"name": f"src-{uuid.uuid4().hex[:8]}"},
            "spec": {"provisionerClassName": model.PLAIN_CLASS, "source": source},
        }
    )


def resolve(kube: Kube, b: Obj) -> Obj:
    """One Resolve action as the planner asks for it, performed; the live Bundle after."""
    settings = Settings(system_namespace=NS, image="registry.example/rukpak:t")
    (action,) = bundleplan.plan(b, bundleplan.Observed(), settings=settings)
    assert isinstance(action, bundleplan.Resolve)
    with contextlib.suppress(errors.Unavailable):  # retried by the queue; status says why
        actuate.resolve_bundle(kube, b, action, plan_helpers.as_is)
    live = kube.get(actuate.bundle_ref(model.name_of(b)))
    assert live is not None
    return live


def unpacked(b: Obj) -> tuple[str, str, str]:
    cond = bundleplan.unpacked_condition(b) or {}
    return str(b["status"]["phase"]), str(cond.get("reason")), str(cond.get("message"))


def test_missing_and_mutable_configmaps_fail_naming_them_until_fixed(kube: Kube) -> None:
    configmap(kube, "mutable", {"a.yaml": CM}, immutable=False)
    source = {
        "type": "configMaps",
        "configMaps": [
            {"configMap": {"name": "missing"}, "path": "manifests"},
            {"configMap": {"name": "mutable"}, "path": "manifests"},
        ],
    }
    b = bundle(kube, source)
    live = resolve(kube, b)
    assert unpacked(live) == (
        "Failing",
        "UnpackFailed",
        f'source bundle content: get configmap {NS}/missing: ConfigMap "missing" not found; '
        f"configmap {NS}/mutable is mutable: all bundle configmaps must be immutable",
    )
    assert sources.pinned(live) is None
    configmap(kube, "missing", {"b.yaml": CM, "c.yaml": CM})
    kube.delete(ObjectRef("", "v1", "ConfigMap", NS, "mutable"))
    configmap(kube, "mutable", {"a.yaml": CM})
    live = resolve(kube, live)  # the planner asks again: a fix is picked up
    assert live["status"]["resolvedSource"] == source  # upstream's shape, kept by the schema
    pinned = sources.pinned(live)
    assert pinned is not None
    assert sources.volume(pinned) == {
        "name": "bundle",
        "projected": {
            "sources": [
                {
                    "configMap": {
                        "name": "missing",
                        "items": [
                            {"key": "b.yaml", "path": "manifests/b.yaml"},
                            {"key": "c.yaml", "path": "manifests/c.yaml"},
                        ],
                    }
                },
                {
                    "configMap": {
                        "name": "mutable",
                        "items": [{"key": "a.yaml", "path": "manifests/a.yaml"}],
                    }
                },
            ]
        },
    }
    settings = Settings(system_namespace=NS, image="registry.example/rukpak:t")
    actions = bundleplan.plan(live, bundleplan.Observed(), settings=settings)
    creates = [a for a in actions if isinstance(a, bundleplan.CreatePod)]
    assert len(creates) == 1, actions
    (create,) = creates
    assert create.pod["spec"]["volumes"] == [sources.volume(pinned)]
    # the status the planner wants equals the live one: nothing of ours leaks into status
    assert [a for a in actions if isinstance(a, bundleplan.WriteStatus)] == []


def test_two_configmaps_writing_one_path_and_escaping_paths_are_refused(kube: Kube) -> None:
    configmap(kube, "one", {"a.yaml": CM})
    configmap(kube, "two", {"a.yaml": CM})
    entries = [
        {"configMap": {"name": "one"}, "path": "manifests"},
        {"configMap": {"name": "two"}, "path": "./manifests/"},
        {"configMap": {"name": "one"}, "path": "../up"},
    ]
    with pytest.raises(errors.FailedPrecondition) as exc:
        resolution.configmap_items(kube, entries, namespace=NS)
    assert exc.value.message == (
        f'source bundle content: configmap {NS}/two contains path "manifests/a.yaml" which is '
        f"already referenced by configmap {NS}/one; configmap {NS}/one: path '../up' is "
        "outside the bundle: use a relative path"
    )


@pytest.fixture
def server(tmp_path: Path) -> Iterator[SourceServer]:
    with serving(tmp_path / "repos", auth=True) as s:
        yield s


def test_a_git_branch_is_pinned_to_its_commit_in_upstreams_shape(
    kube: Kube, server: SourceServer, tmp_path: Path
) -> None:
    head = make_repo(tmp_path / "repos" / "b.git", {"manifests/a.yaml": CM})
    secret(kube, "git-auth")
    spec = {
        "repository": server.repo_url("b.git"),
        "directory": ".",
        "ref": {"branch": "main"},
        "auth": {"secret": {"name": "git-auth"}},
    }
    live = resolve(kube, bundle(kube, {"type": "git", "git": spec}))
    assert live["status"]["resolvedSource"] == {
        "type": "git",
        "git": {**spec, "ref": {"commit": head}},
    }
    pinned = sources.pinned(live)
    assert pinned is not None
    assert sources.volume(pinned)["csi"] == {
        "driver": "csi.rukpak.io",
        "readOnly": True,
        "volumeAttributes": {"git": spec["repository"], "commit": head, "directory": "."},
        "nodePublishSecretRef": {"name": "git-auth"},
    }
    missing = resolve(kube, bundle(kube, {"type": "git", "git": {**spec, "ref": {"tag": "v9"}}}))
    assert unpacked(missing) == (
        "Failing",
        "UnpackFailed",
        f"git repository {spec['repository']} has no refs/tags/v9",
    )
    escape = {**spec, "directory": "../other"}
    live = resolve(kube, bundle(kube, {"type": "git", "git": escape}))
    assert unpacked(live)[2] == (
        f'get subdirectory "../other" for repository "{spec["repository"]}": directory can not '
        "start with '../' or '/'"
    )


def test_an_http_source_is_pinned_by_the_digest_of_its_content(
    kube: Kube, server: SourceServer
) -> None:
    data = tarball({"manifests/a.yaml": CM})
    server.files["b.tgz"] = data
    secret(kube, "http-auth")
    url = f"{server.url}/files/b.tgz"
    spec = {"url": url, "auth": {"secret": {"name": "http-auth"}}}
    live = resolve(kube, bundle(kube, {"type": "http", "http": spec}))
    hex_ = hashlib.sha256(data).hexdigest()
    assert live["status"]["resolvedSource"] == {
        "type": "http",
        "http": {**spec, "url": f"{url}#sha256={hex_}"},
    }
    pinned = sources.pinned(live)
    assert pinned is not None
    assert sources.volume(pinned)["csi"]["volumeAttributes"] == {
        "url": url,
        "digest": f"sha256:{hex_}",
    }
    no_secret = {"url": url, "auth": {"secret": {"name": "nope"}}}
    live = resolve(kube, bundle(kube, {"type": "http", "http": no_secret}))
    assert unpacked(live) == (
        "Failing",
        "UnpackFailed",
        f"auth secret {NS}/nope not found: create it in the system namespace",
    )
    gone = {**spec, "url": f"{server.url}/files/x"}
    live = resolve(kube, bundle(kube, {"type": "http", "http": gone}))
    assert unpacked(live) == (
        "Failing",
        "UnpackFailed",
        f'GET {server.url}/files/x: unexpected status "404 Not Found"',
    )
