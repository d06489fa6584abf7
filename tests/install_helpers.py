"""pytest plugin: RukPak installed on the local cluster from the shipped manifests.

Where it sits: the end-to-end tests of the installed system take the session fixture
``standing_system`` (the default install) or, where the run pod itself is the subject,
``rukpak_system``. It builds and pushes the project's image
(``tests.image_helpers``), writes a kustomize overlay made only of ``deploy/``, the
shipped components ``kubelet-root`` and ``host-network``, the image and this node's
values (kubelet root, plugin cache dir, API server address), renders it with the
cluster's ``kubectl kustomize``, applies it and waits until every DaemonSet and
Deployment it holds has rolled out. No test manifest is written by hand: what runs is
what users install.

Teardown, in the order a person would: BundleDeployments are deleted while the manager
still runs (its finalizer uninstalls what they installed); then the manager and every
other pod of rukpak-system that may mount a bundle volume; then the rest of the install,
the node plugin last, and the test waits until no CSI volume of ours is mounted.

Tests using ``rukpak_system`` run after every other test of the session
(``pytest_collection_modifyitems``): the installed DaemonSet owns the kubelet's
``csi.rukpak.io`` registration, which the host-process plugin of the other e2e tests
would otherwise fight over. The installed system first runs a pod per change (``run-pods``,
for ``test_e2e_instance``, the run-pod test of ``test_e2e_runs`` and ``test_e2e_daemonset``);
``standing_system`` switches it to the default install once, for every test of a behaviour,
which run last; after each of those, ``_no_pod_per_change`` checks that no pod was started
in the system namespace for any change the test made.

Enable with ``pytest_plugins = [..., "tests.install_helpers"]``.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import ObjectRef
from provisioner.manager import model
from tests import e2e_helpers as e2e
from tests import image_helpers
from tests.bundles import bundle_deployment as bundle_deployment
from tests.cluster import bins
from tests.derived import below
from tests.polling import eventually

REPO_ROOT = Path(__file__).resolve().parent.parent
DEPLOY = REPO_ROOT / "deploy"
COMPONENTS = ("run-pods", "kubelet-root", "host-network")
"""What the session's installed system adds to ``deploy/``: a pod per change (the modules
that test runs as pods), this node's kubelet root and the host network."""
STANDING = tuple(c for c in COMPONENTS if c != "run-pods")
"""The same without ``run-pods``: the default install, runs taken by the standing
provisioner (``test_e2e_standing``, ``bench_standing``)."""
NAMESPACE = "rukpak-system"
PART_OF = "app.kubernetes.io/part-of=rukpak"
MANAGER = "rukpak-manager"
DAEMONSET = "rukpak-csi-node"
ROLLOUT_TIMEOUT = 240  # seconds: a cold node pulls the ~100 MB image once
BDS_V2 = f"bundledeployments.{model.VERSION_V2}.{model.GROUP}"  # for kubectl


def kubectl_binary() -> Path:
    found = bins.find("kubectl")
    if found is None:
        pytest.fail(
            "no kubectl binary: run `make k8s-bins` (make test does) or set KUBEBUILDER_ASSETS"
        )
    return found


def run_kubectl(
    kubeconfig: Path, *args: str, timeout: float = 60, check: bool = True, stdin: str | None = None
) -> str:
    """``kubectl --kubeconfig KUBECONFIG ARGS``; stdout, or RuntimeError with both streams."""
    return e2e.run_tool(
        [str(kubectl_binary()), "--kubeconfig", str(kubeconfig), *args],
        what=f"kubectl {' '.join(args)}",
        timeout=timeout,
        check=check,
        stdin=stdin,
    )


def render_overlay(
    workdir: Path, *components: Path, **fields: Any
) -> dict[tuple[str, str], dict[str, Any]]:
    """``kubectl kustomize`` of an overlay of ``deploy/`` with ``components`` and more
    kustomization ``fields`` (no cluster needed): the objects by (kind, name)."""
    overlay = workdir / "overlay"
    overlay.mkdir(parents=True)
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(DEPLOY, overlay)],
        "components": [os.path.relpath(c, overlay) for c in components],
        **fields,
    }
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    rendered = run_kubectl(workdir / "no-kubeconfig", "kustomize", str(overlay))
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(rendered) if d}


def write_overlay(
    directory: Path,
    *,
    image: str,
    kubelet_dir: Path,
    state_dir: Path,
    api_server: dict[str, str],
    components: tuple[str, ...] = COMPONENTS,
    patches: tuple[dict[str, Any], ...] = (),
) -> Path:
    """The test cluster's overlay: ``deploy/`` + the shipped components + values only.

    ``image`` is ``repository@sha256:...`` or ``repository:tag``. Kustomize wants paths
    relative to the overlay, so ``directory`` may lie anywhere (a temp dir).
    """
    directory.mkdir(parents=True, exist_ok=True)
    rel = Path(os.path.relpath(DEPLOY, directory))
    name, digest = image.split("@", 1) if "@" in image else (image, "")
    override: dict[str, str] = {"name": "rukpak-python"}
    if digest:
        override |= {"newName": name, "digest": digest}
    else:
        repo, _, tag = name.rpartition(":")
        override |= {"newName": repo, "newTag": tag}
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [str(rel)],
        "components": [str(rel / "components" / c) for c in components],
        "configMapGenerator": [
            {
                "name": "rukpak-node-paths",
                "literals": [f"kubeletRoot={kubelet_dir}", f"stateDir={state_dir}"],
            },
        ]
        + (
            [
                {
                    "name": "rukpak-apiserver",
                    "namespace": NAMESPACE,
                    "literals": [f"{k}={v}" for k, v in sorted(api_server.items())],
                }
            ]
            if "host-network" in components
            else []
        ),
        "images": [override],
    }
    if patches:
        kustomization["patches"] = list(patches)
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return directory


@dataclass(frozen=True)
class RukpakSystem:
    """The installed system and what tests need to use it."""

    cluster: Any
    kube: Kube
    image: str
    workdir: Path
    manifests: Path  # the rendered overlay, exactly what was applied
    state_dir: Path  # the plugin's cache as the nodes see it
    namespace: str = NAMESPACE

    kubeconfig = below("cluster.kubeconfig")
    kubelet_dir = below("cluster.kubelet_dir")

    @property
    def registry_host(self) -> str:
        return str(self.cluster.registry_host)

    @property
    def busybox_image(self) -> str:
        return str(self.cluster.busybox_image)

    def kubectl(
        self, *args: str, timeout: float = 60, check: bool = True, stdin: str | None = None
    ) -> str:
        return run_kubectl(self.kubeconfig, *args, timeout=timeout, check=check, stdin=stdin)

    def documents(self) -> list[dict[str, Any]]:
        return [d for d in yaml.safe_load_all(self.manifests.read_text()) if d]

    def describe(self, *what: str, namespace: str = NAMESPACE) -> str:
        """``kubectl describe`` and pod logs for a failure message (never raises)."""
        out = []
        for kind in what or ("deployments,daemonsets,pods",):
            out.append(self.kubectl("describe", kind, "-n", namespace, timeout=30, check=False))
        out.append(self.kubectl("get", "events", "-n", namespace, timeout=30, check=False))
        for pod in self.kubectl(
            "get", "pods", "-n", namespace, "-o", "name", timeout=30, check=False
        ).split():
            log = self.kubectl(
                "logs", "-n", namespace, pod, "--all-containers", "--tail=30", check=False
            )
            out.append(f"--- {pod} (last lines)\n{log}")
        return "\n".join(out)


def rollout(system: RukpakSystem, docs: list[dict[str, Any]], *, timeout: float) -> None:
    """Wait until every DaemonSet and Deployment in ``docs`` has rolled out."""
    for doc in docs:
        if doc["kind"] not in ("DaemonSet", "Deployment"):
            continue
        meta = doc["metadata"]
        what = f"{doc['kind'].lower()}/{meta['name']}"
        try:
            system.kubectl(
                "rollout", "status", what, "-n", meta.get("namespace", NAMESPACE),
                f"--timeout={int(timeout)}s", timeout=timeout + 30,
            )  # fmt: skip
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            raise AssertionError(f"{what} did not roll out: {e}\n{system.describe()}") from None


def hello_bundle(target: Path, *, namespace: str, image: str, greeting: str = "") -> Path:
    """``examples/bundles/hello`` living in ``namespace``, its Deployment running ``image``
    (the node's busybox: no internet here), optionally with another greeting."""
    manifests = target / "manifests"
    manifests.mkdir(parents=True)
    for path in sorted((e2e.HELLO_BUNDLE / "manifests").iterdir()):
        doc = yaml.safe_load(path.read_text())
        if doc["kind"] == "Namespace":
            doc["metadata"]["name"] = namespace
        else:
            doc["metadata"]["namespace"] = namespace
        if doc["kind"] == "Deployment":
            for container in doc["spec"]["template"]["spec"]["containers"]:
                container["image"] = image
        if doc["kind"] == "ConfigMap" and greeting:
            doc["data"]["greeting"] = greeting
        (manifests / path.name).write_text(yaml.safe_dump(doc))
    return target


def greeting_ref(ns: str) -> ObjectRef:
    """The ConfigMap holding the greeting of a hello bundle installed into ``ns``."""
    return ObjectRef("", "v1", "ConfigMap", ns, "hello-greeting")


def greeting(system: RukpakSystem, ns: str) -> str:
    """The greeting of the hello bundle installed into ``ns`` ("" while there is none)."""
    cm = system.kube.get(greeting_ref(ns)) or {}
    return str((cm.get("data") or {}).get("greeting") or "")


def bd_v2(name: str, ref: str, **spec: object) -> dict[str, Any]:
    """A v1alpha2 BundleDeployment of the plain image ``ref`` into ``default``, with more
    ``spec`` fields."""
    return {
        "apiVersion": "core.rukpak.io/v1alpha2",
        "kind": "BundleDeployment",
        "metadata": {"name": name},
        "spec": {
            "installNamespace": "default",
            "provisionerClassName": "core-rukpak-io-plain",
            "source": {"type": "image", "image": {"ref": ref}},
            **spec,
        },
    }


def live_v2(system: RukpakSystem, name: str) -> dict[str, Any]:
    """BundleDeployment ``name`` read as v1alpha2 ({} when it is gone)."""
    ref = ObjectRef("core.rukpak.io", "v1alpha2", "BundleDeployment", "", name)
    return system.kube.get(ref) or {}


def cond_v2(system: RukpakSystem, name: str, kind: str) -> tuple[str, str, str]:
    """(status, reason, message) of its condition ``kind`` ("None" when absent)."""
    c = conditions(live_v2(system, name)).get(kind) or {}
    return str(c.get("status")), str(c.get("reason")), str(c.get("message"))


def set_source_v2(system: RukpakSystem, name: str, source: dict[str, Any]) -> None:
    """Merge-patch the ``spec.source`` of v1alpha2 BundleDeployment ``name``."""
    ref = ObjectRef("core.rukpak.io", "v1alpha2", "BundleDeployment", "", name)
    system.kube.merge_patch(ref, {"spec": {"source": source}})


def installed_v2(system: RukpakSystem, name: str, *, what: str, timeout: float = 180) -> None:
    """Wait until v1alpha2 BundleDeployment ``name`` is ``Installed`` (``what``: the
    message if it never is)."""
    eventually(lambda: cond_v2(system, name, "Installed")[0] == "True", timeout=timeout, what=what)


def configmap_bundle(system: RukpakSystem, name: str, files: dict[str, str]) -> None:
    """A new immutable ConfigMap ``name`` in the system namespace holding ``files``: a
    bundle for :func:`configmaps_source`."""
    system.kube.create(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "immutable": True,
            "data": files,
        }
    )


def configmaps_source(name: str) -> dict[str, Any]:
    """A ``configMaps`` source reading ConfigMap ``name`` as the bundle's ``manifests``."""
    return {
        "type": "configMaps",
        "configMaps": [{"configMap": {"name": name}, "path": "manifests"}],
    }


def delete_v2(system: RukpakSystem, *names: str, timeout: float = 150) -> None:
    """``kubectl delete`` the v1alpha2 BundleDeployments ``names``, one after the other,
    each waited for until it is gone (its objects go right after it: ``gone``)."""
    for name in names:
        system.kubectl("delete", BDS_V2, name, timeout=timeout)


def gone(system: RukpakSystem, ref: ObjectRef, *, timeout: float = 60) -> None:
    """Wait until ``ref`` is gone, or at least being deleted (an uninstalled object: a
    deleted BundleDeployment goes first, as upstream's garbage collection has it)."""

    def deleted() -> bool:
        live = system.kube.get(ref)
        return live is None or bool((live.get("metadata") or {}).get("deletionTimestamp"))

    eventually(deleted, timeout=timeout, what=f"{ref.kind} {ref.namespace}/{ref.name} deleted")


def conditions(obj: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """``status.conditions`` by type."""
    found = ((obj or {}).get("status") or {}).get("conditions") or []
    return {c["type"]: c for c in found}


def csi_mounts(kubelet_dir: Path, *, pid: int | None = None) -> list[Path]:
    """Our CSI volumes mounted under the kubelet's pods dir (of the node whose mount
    namespace process ``pid`` is in, when given)."""
    return [
        m.mount_point
        for m in e2e.mounts_under(kubelet_dir / "pods", pid=pid)
        if "kubernetes.io~csi" in str(m.mount_point)
    ]


def all_csi_mounts(system: RukpakSystem) -> list[Path]:
    """``csi_mounts`` of every node of the system's cluster."""
    machines = getattr(system.cluster, "machines", [])
    if not machines:
        return csi_mounts(system.kubelet_dir)
    return [
        p
        for m in machines
        if m.holder.running()  # a node taken down for good has no mounts left
        for p in csi_mounts(system.kubelet_dir, pid=m.holder.pid)
    ]


def uninstall(system: RukpakSystem) -> None:
    """Remove what the install made, workloads before the plugin that serves their volumes."""
    kubectl = system.kubectl
    if "bundledeployments" in kubectl("api-resources", "-o", "name", check=False):
        done = subprocess.run(
            [str(kubectl_binary()), "--kubeconfig", str(system.kubeconfig), "delete",
             "bundledeployments", "--all", "--timeout=120s"],
            capture_output=True, text=True, timeout=150, check=False,
        )  # fmt: skip
        if done.returncode != 0:  # the manager could not finish: do not hang the session
            print(f"\nrukpak_system teardown: BundleDeployments left: {done.stderr}")
            for name in kubectl("get", "bundledeployments", "-o", "name", check=False).split():
                kubectl("patch", name, "--type=merge", "-p", '{"metadata":{"finalizers":null}}',
                        check=False)  # fmt: skip
        kubectl("delete", "bundles", "--all", "--wait=false", check=False)
    # the manager first (it would recreate what follows), then every pod but the plugin's
    kubectl("delete", "deployment", MANAGER, "-n", NAMESPACE, "--ignore-not-found", check=False)
    kubectl("delete", "deployments,jobs,pods", "-n", NAMESPACE, "-l",
            "app.kubernetes.io/component!=node-plugin", "--timeout=120s", timeout=150,
            check=False)  # fmt: skip
    # Before the plugin goes: a pod deleted with no grace period is gone from the API
    # while the kubelet still has to unpublish its volume through the plugin.
    eventually(
        lambda: not all_csi_mounts(system),
        timeout=60,
        what="no csi.rukpak.io volume mounted under the kubelet's pods dir",
    )
    kubectl("delete", "-f", str(system.manifests), "--ignore-not-found", "--wait=true",
            "--timeout=120s", timeout=180, check=False)  # fmt: skip


def switch_to_standing(system: RukpakSystem) -> RukpakSystem:
    """Apply the default install (``STANDING``: the standing provisioner, no pod per
    change) over ``system``'s and wait for the rollouts; the switched system."""
    overlay = write_overlay(
        system.workdir / "overlay-standing",
        image=system.image,
        kubelet_dir=Path(system.cluster.kubelet_dir),
        state_dir=system.state_dir,
        api_server=system.cluster.in_cluster_env(),
        components=STANDING,
    )
    manifests = system.workdir / "rukpak-standing.yaml"
    manifests.write_text(system.kubectl("kustomize", str(overlay)))
    switched = dataclasses.replace(system, manifests=manifests)
    system.kubectl("apply", "-f", str(manifests), timeout=120)
    rollout(switched, switched.documents(), timeout=ROLLOUT_TIMEOUT)
    return switched


def install(
    cluster: Any,
    workdir: Path,
    image: str,
    *,
    components: tuple[str, ...] = COMPONENTS,
    state_dir: Path | None = None,
    patches: tuple[dict[str, Any], ...] = (),
) -> RukpakSystem:
    """Render the test overlay for ``cluster``'s nodes, apply it, wait for the rollouts.

    ``components`` are the shipped ones the overlay adds (the multi-node cluster needs no
    ``host-network``); ``state_dir`` is the plugin's cache as the nodes see it (default:
    below ``workdir``). On failure what was applied is removed again before the error
    propagates.
    """
    state_dir = state_dir or workdir / "plugin-state"
    overlay = write_overlay(
        workdir / "overlay",
        image=image,
        kubelet_dir=Path(cluster.kubelet_dir),
        state_dir=state_dir,
        api_server=cluster.in_cluster_env(),
        components=components,
        patches=patches,
    )
    manifests = workdir / "rukpak.yaml"
    manifests.write_text(run_kubectl(cluster.kubeconfig, "kustomize", str(overlay)))
    kube = Kube.from_kubeconfig(str(cluster.kubeconfig))
    system = RukpakSystem(
        cluster=cluster,
        kube=kube,
        image=image,
        workdir=workdir,
        manifests=manifests,
        state_dir=state_dir,
    )
    try:
        system.kubectl("apply", "-f", str(manifests), timeout=120)
        rollout(system, system.documents(), timeout=ROLLOUT_TIMEOUT)
    except BaseException:
        try:
            uninstall(system)
        finally:
            kube.close()
        raise
    return system


@pytest.fixture(scope="session")
def rukpak_system(kube_cluster: Any, request: pytest.FixtureRequest) -> Iterator[RukpakSystem]:
    """RukPak installed from ``deploy/`` with the locally built image, rolled out."""
    e2e.require_local_node(kube_cluster)
    ref = f"{kube_cluster.registry_host}/rukpak/rukpak-python:e2e"
    image = image_helpers.build_and_push(ref, request=request)
    workdir = Path(tempfile.mkdtemp(prefix="rk-install-"))
    system = install(kube_cluster, workdir, image)
    try:
        yield system
    finally:
        try:
            uninstall(system)
        finally:
            system.kube.close()
            if not e2e.mounts_under(workdir):
                shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def standing_system(rukpak_system: RukpakSystem) -> RukpakSystem:
    """``rukpak_system`` switched to the default install (the standing provisioner, no pod
    per change), once for the session: its tests run after every other test of the
    installed system (``tests.conftest``), so nothing switches back."""
    return switch_to_standing(rukpak_system)


PROVISIONER = "rukpak-provisioner"


def provisioner_log(system: RukpakSystem) -> str:
    """The standing provisioners' log (every replica's)."""
    return system.kubectl(
        "logs", "-n", NAMESPACE, "-l", f"app.kubernetes.io/name={PROVISIONER}",
        "--tail=-1", "--prefix", timeout=30, check=False,
    )  # fmt: skip


def taken_standing(system: RukpakSystem, run: str) -> bool:
    """Whether a standing provisioner took run ``run`` (an instance run or a Bundle check
    named as its pod would have been)."""
    return f"run={run}" in provisioner_log(system)


def pods_scheduled(system: RukpakSystem) -> set[str]:
    """Pods of the system namespace the scheduler ever placed (its Scheduled events)."""
    out = system.kubectl(
        "get", "events", "-n", NAMESPACE, "--field-selector", "reason=Scheduled",
        "-o", "jsonpath={range .items[*]}{.involvedObject.name}{'\\n'}{end}",
    )  # fmt: skip
    return set(out.split())


def workload_prefixes(system: RukpakSystem) -> tuple[str, ...]:
    """Name prefixes of the pods the install itself runs (its Deployments and DaemonSets):
    any other pod placed in the system namespace was started for a change."""
    return tuple(
        f"{d['metadata']['name']}-"
        for d in system.documents()
        if d["kind"] in ("Deployment", "DaemonSet")
    )


def pods_for_changes(system: RukpakSystem, before: set[str]) -> list[str]:
    """Pods placed in the system namespace since ``before`` (``pods_scheduled``) that are
    none of the install's own: run pods, unpack pods."""
    prefixes = workload_prefixes(system)
    return sorted(p for p in pods_scheduled(system) - before if not p.startswith(prefixes))


@pytest.fixture(autouse=True)
def _no_pod_per_change(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test of the default install (``standing_system``) proves, beside what it
    asserts, that no pod was started for any change it made: runs and Bundle checks are
    taken by the standing provisioner."""
    if "standing_system" not in request.fixturenames:
        yield
        return
    system: RukpakSystem = request.getfixturevalue("standing_system")
    before = pods_scheduled(system)
    yield
    started = pods_for_changes(system, before)
    assert started == [], f"pods were started for a change on the standing install: {started}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests of the installed system last: see the module docstring."""
    items.sort(key=lambda item: "rukpak_system" in getattr(item, "fixturenames", ()))


def restart_managers(system: RukpakSystem) -> None:
    """A rollout restart of the manager, waited for until no pod of the old ones is left: a
    replica still terminating may still lead for a moment, with what it kept in memory."""

    def managers() -> set[str]:
        pods, _ = system.kube.list(
            "v1",
            "Pod",
            namespace=NAMESPACE,
            label_selector=f"app.kubernetes.io/name={MANAGER}",
        )
        return {p["metadata"]["name"] for p in pods}

    old = managers()
    manager = ("-n", NAMESPACE, f"deployment/{MANAGER}")
    system.kubectl("rollout", "restart", *manager)
    system.kubectl("rollout", "status", *manager, "--timeout=240s", timeout=260)
    eventually(lambda: not managers() & old, timeout=120, what="the old manager pods gone")
