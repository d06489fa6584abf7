"""End to end: git, http and configMaps Bundle sources on the local kubelet, with RukPak's
default install from ``deploy/`` (the ``standing_system`` fixture: the standing provisioner,
no pod per change).

A real git smart-HTTP server and tarball server (``tests.source_servers``, basic auth)
and Debian's sshd (git over SSH with a key and known hosts) listen on the node's
loopback, which the manager and the node plugin reach through host networking; the auth
Secrets and the ConfigMaps live in the system namespace, as upstream requires. For each
source type a standalone Bundle reaches ``Unpacked``, a broken one reaches
``Failing``/UnpackFailed with a message naming what is wrong, and a BundleDeployment of
the hello bundle from that source (git over HTTPS, http, configMaps) becomes
HasValidBundle and Installed. No pod is started for any of it: the standing provisioner
asks the node plugin for git and http content through its store volume (by the rules of a
pod's volume, with the source's auth Secret) and reads ConfigMaps from the API.
"""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from provisioner.engine.objects import ObjectRef
from provisioner.manager import model
from tests import install_helpers as inst
from tests.polling import eventually
from tests.source_servers import (
    PASSWORD,
    USERNAME,
    SourceServer,
    SshServer,
    make_repo,
    serving,
    tarball,
)

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

CM_YAML = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c, namespace: default}\n"
SUFFIX = uuid.uuid4().hex[:6]
SECRET = f"src-auth-{SUFFIX}"
SSH_SECRET = f"src-ssh-{SUFFIX}"
CONFIGMAP = f"hello-cm-{SUFFIX}"
WAIT = 240.0


@dataclass(frozen=True)
class Sources:
    server: SourceServer
    namespaces: dict[str, str]  # source type -> namespace of its hello bundle
    ssh_url: str = ""

    def source(self, kind: str) -> dict[str, Any]:
        auth = {"secret": {"name": SECRET}}
        if kind == "ssh":
            return {
                "type": "git",
                "git": {
                    "repository": self.ssh_url,
                    "directory": "./hello",
                    "ref": {"branch": "main"},
                    "auth": {"secret": {"name": SSH_SECRET}},
                },
            }
        if kind == "git":
            return {
                "type": "git",
                "git": {
                    "repository": self.server.repo_url("hello.git"),
                    "directory": "./hello",
                    "ref": {"branch": "main"},
                    "auth": auth,
                },
            }
        if kind == "http":
            return {
                "type": "http",
                "http": {"url": f"{self.server.url}/files/hello.tgz", "auth": auth},
            }
        return inst.configmaps_source(CONFIGMAP)


def _files(root: Path) -> dict[str, str]:
    return {f"manifests/{p.name}": p.read_text() for p in sorted((root / "manifests").iterdir())}


@pytest.fixture(scope="module")
def sources(
    standing_system: inst.RukpakSystem, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Sources]:
    system = standing_system
    work = tmp_path_factory.mktemp("sources")
    namespaces = {k: f"e2e-src-{k.lower()}-{SUFFIX}" for k in ("git", "http", "configMaps")}
    bundles = {
        k: _files(inst.hello_bundle(work / k, namespace=ns, image=system.busybox_image))
        for k, ns in namespaces.items()
    }
    make_repo(
        work / "repos" / "hello.git",
        {f"hello/{name}": text for name, text in bundles["git"].items()} | {"README": "x"},
    )
    system.kube.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SECRET, "namespace": inst.NAMESPACE},
            "stringData": {"username": USERNAME, "password": PASSWORD},
        }
    )
    inst.configmap_bundle(
        system,
        CONFIGMAP,
        {name.removeprefix("manifests/"): text for name, text in bundles["configMaps"].items()},
    )
    sshd = SshServer(work / "sshd").start()
    system.kube.create(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": SSH_SECRET, "namespace": inst.NAMESPACE},
            "stringData": {"ssh-privatekey": sshd.client_key, "ssh-knownhosts": sshd.known_hosts},
        }
    )
    try:
        with serving(work / "repos", auth=True) as server:
            server.files["hello.tgz"] = tarball(bundles["http"])
            yield Sources(
                server=server,
                namespaces=namespaces,
                ssh_url=sshd.url(work / "repos" / "hello.git"),
            )
            for name in list(_created):
                system.kubectl("delete", name, "--timeout=120s", "--ignore-not-found", check=False)
    finally:
        sshd.stop()
        system.kubectl("delete", "-n", inst.NAMESPACE, f"secret/{SSH_SECRET}", check=False)
    for ns in namespaces.values():
        system.kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=false")
    system.kubectl("delete", "-n", inst.NAMESPACE, f"secret/{SECRET}", f"configmap/{CONFIGMAP}")
    shutil.rmtree(work, ignore_errors=True)


_created: list[str] = []


def pods_started(system: inst.RukpakSystem, name: str) -> list[str]:
    """The pods of ``name`` (a Bundle's unpack pod, named after it, or a BundleDeployment's
    instance run pods, and its Bundles') the scheduler ever placed in the system namespace."""
    out = system.kubectl(
        "get", "events", "-n", inst.NAMESPACE, "--field-selector", "reason=Scheduled",
        "-o", "jsonpath={range .items[*]}{.involvedObject.name}{'\\n'}{end}",
    )  # fmt: skip
    prefixes = (name, model.instance_name(name))
    return [line for line in out.splitlines() if line.startswith(prefixes)]


def _bundle(system: inst.RukpakSystem, name: str, source: dict[str, Any]) -> None:
    system.kube.create(
        {
            "apiVersion": "core.rukpak.io/v1alpha1",
            "kind": "Bundle",
            "metadata": {"name": name},
            "spec": {"provisionerClassName": "core-rukpak-io-plain", "source": source},
        }
    )
    _created.insert(0, f"bundle/{name}")


def _wait_phase(system: inst.RukpakSystem, name: str, phase: str) -> dict[str, Any]:
    ref = ObjectRef("core.rukpak.io", "v1alpha1", "Bundle", "", name)

    def reached() -> dict[str, Any] | None:
        live = system.kube.get(ref) or {}
        return live if (live.get("status") or {}).get("phase") == phase else None

    try:
        return eventually(reached, timeout=WAIT, what=f"Bundle {name} {phase}")
    except AssertionError as e:
        detail = system.kubectl("describe", "bundle", name, check=False)
        raise AssertionError(f"{e}\n{detail}\n{system.describe()}") from None


def _unpacked(bundle: dict[str, Any]) -> dict[str, Any]:
    return inst.conditions(bundle)["Unpacked"]


@pytest.mark.parametrize("kind", ["git", "ssh", "http", "configMaps"])
def test_a_bundle_of_each_source_unpacks(
    standing_system: inst.RukpakSystem, sources: Sources, kind: str
) -> None:
    name = f"src-{kind.lower()}-{SUFFIX}"
    _bundle(standing_system, name, sources.source(kind))
    live = _wait_phase(standing_system, name, "Unpacked")
    cond = _unpacked(live)
    source_type = "git" if kind == "ssh" else kind
    assert cond["reason"] == "UnpackSuccessful", cond
    assert cond["message"] == (
        f"Successfully unpacked the {source_type} Bundle: 3 objects (ConfigMap 1, Deployment 1, "
        "Namespace 1)"
    )
    resolved = live["status"]["resolvedSource"]
    assert resolved["type"] == source_type
    if source_type == "git":
        assert len(resolved["git"]["ref"]["commit"]) == 40
    if kind == "http":
        assert "#sha256=" in resolved["http"]["url"]
    assert pods_started(standing_system, name) == [], "a pod was started to unpack"


def test_broken_sources_fail_with_a_message_naming_the_problem(
    standing_system: inst.RukpakSystem, sources: Sources
) -> None:
    system = standing_system
    git = sources.source("git")
    git["git"]["directory"] = "./nothing-here"
    http = sources.source("http")
    http["http"]["url"] = f"{sources.server.url}/redirect-away/files/hello.tgz"
    cms = {"type": "configMaps", "configMaps": [{"configMap": {"name": "absent"}}]}
    # upstream's case: its subdir bundle's files flattened into one ConfigMap, a
    # .gitignore holding "!.gitignore" (a YAML local tag) among them
    invalid = f"invalid-{SUFFIX}"
    inst.configmap_bundle(system, invalid, {"cm.yaml": CM_YAML, ".gitignore": "!.gitignore\n"})
    bad_cm = inst.configmaps_source(invalid)
    cases = {"git": git, "http": http, "cm": cms, "cm-invalid": bad_cm}
    for kind, source in cases.items():
        _bundle(system, f"src-bad-{kind}-{SUFFIX}", source)
    messages = {
        kind: _unpacked(_wait_phase(system, f"src-bad-{kind}-{SUFFIX}", "Failing"))
        for kind in cases
    }
    assert all(m["reason"] == "UnpackFailed" for m in messages.values()), messages
    assert 'get subdirectory "nothing-here"' in messages["git"]["message"], messages
    assert "redirected to another host" in messages["http"]["message"], messages
    assert messages["cm"]["message"] == (
        f"source bundle content: get configmap {inst.NAMESPACE}/absent: "
        'ConfigMap "absent" not found'  # upstream's words
    )
    assert "json: cannot unmarshal string into Go value" in messages["cm-invalid"]["message"]
    assert "could not determine a constructor" not in messages["cm-invalid"]["message"]
    # no pod was started for any of them, and the failed git Bundle's run goes with it
    assert [p for kind in cases for p in pods_started(system, f"src-bad-{kind}-{SUFFIX}")] == []
    run = ObjectRef("", "v1", "ConfigMap", inst.NAMESPACE, f"src-bad-git-{SUFFIX}")
    eventually(lambda: system.kube.get(run) is None, timeout=60, what="the check's run gone")


@pytest.mark.parametrize("kind", ["git", "http", "configMaps"])
def test_a_bundledeployment_of_each_source_installs(
    standing_system: inst.RukpakSystem, sources: Sources, kind: str
) -> None:
    system = standing_system
    name = f"src-bd-{kind.lower()}-{SUFFIX}"
    bd = inst.bundle_deployment(name, "unused")
    bd["spec"]["template"]["spec"]["source"] = sources.source(kind)
    system.kube.create(bd)
    _created.insert(0, f"bundledeployment/{name}")
    ref = ObjectRef("core.rukpak.io", "v1alpha1", "BundleDeployment", "", name)

    def installed() -> dict[str, Any] | None:
        conds = inst.conditions(system.kube.get(ref))
        ok = all(conds.get(t, {}).get("status") == "True" for t in ("HasValidBundle", "Installed"))
        return conds if ok else None

    try:
        conds = eventually(installed, timeout=WAIT, what=f"{name} HasValidBundle and Installed")
    except AssertionError as e:
        detail = system.kubectl("describe", "bundledeployment,bundle", check=False)
        raise AssertionError(f"{e}\n{detail}\n{system.describe()}") from None
    assert conds["Installed"]["reason"] == "InstallationSucceeded", conds
    greeting = system.kube.get(
        ObjectRef("", "v1", "ConfigMap", sources.namespaces[kind], "hello-greeting")
    )
    assert greeting is not None
    assert pods_started(system, name) == [], "a pod was started to install"


def test_a_configmap_in_use_by_a_bundle_cannot_be_deleted(
    standing_system: inst.RukpakSystem, sources: Sources
) -> None:
    system = standing_system
    name = f"in-use-{SUFFIX}"
    cm = f"in-use-{SUFFIX}"
    inst.configmap_bundle(system, cm, {"cm.yaml": CM_YAML})
    _bundle(system, name, inst.configmaps_source(cm))
    done = subprocess.run(
        [str(inst.kubectl_binary()), "--kubeconfig", str(system.kubeconfig), "delete",
         "configmap", cm, "-n", inst.NAMESPACE],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0, done.stdout
    assert f'configmap "{cm}" is in use by bundle "{name}"' in done.stderr
    system.kubectl("delete", "bundle", name)
    system.kubectl("delete", "configmap", cm, "-n", inst.NAMESPACE)
