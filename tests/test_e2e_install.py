"""End to end: RukPak installed from ``deploy/`` the way a cluster operator installs it.

The ``standing_system`` fixture (``tests.install_helpers``) builds the project's image,
renders ``deploy/`` plus the shipped components for this node with ``kubectl kustomize``
and applies it: the default install, whose standing provisioner takes every run (no pod
per change, checked after each test). Here, each test on its own: every component's pod
runs that one image;
two manager replicas run and exactly one holds the ``rukpak-manager`` Lease; the CRD
webhook's configuration carries the manager's CA; a BundleDeployment of the hello bundle
becomes Installed and Healthy and ``kubectl get`` shows the printer columns; the
leader's pod deleted, the other replica takes the Lease; deleting a BundleDeployment
removes what it installed. Then the privilege model: a
BundleDeployment naming a narrow ServiceAccount installs what that account may and is
refused beyond it: its runs name that account, which the standing provisioner acts as.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.engine.objects import ObjectRef
from tests import e2e_helpers as e2e
from tests import install_helpers as inst
from tests.bundles import role_binding
from tests.polling import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

LEASE = ObjectRef("coordination.k8s.io", "v1", "Lease", inst.NAMESPACE, inst.MANAGER)
MANAGER_SELECTOR = "app.kubernetes.io/name=rukpak-manager"


def _pods(system: inst.RukpakSystem, selector: str) -> list[dict[str, Any]]:
    pods, _ = system.kube.list("v1", "Pod", namespace=inst.NAMESPACE, label_selector=selector)
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def _ready(pod: dict[str, Any]) -> bool:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return (
        pod["status"].get("phase") == "Running"
        and bool(statuses)
        and all(s.get("ready") for s in statuses)
    )


def _holder(system: inst.RukpakSystem) -> str:
    live = system.kube.get(LEASE)
    return "" if live is None else str(live["spec"].get("holderIdentity") or "")


@dataclass(frozen=True)
class Hello:
    name: str  # the BundleDeployment
    namespace: str  # the bundle's own namespace
    image: str


@pytest.fixture
def hello(standing_system: inst.RukpakSystem, tmp_path: Path) -> Iterator[Hello]:
    """A hello bundle of its own (its namespace, its image tag) for one test's
    BundleDeployment; the BundleDeployment and the namespace are deleted afterwards."""
    suffix = uuid.uuid4().hex[:6]
    h = Hello(
        name=f"hello-{suffix}",
        namespace=f"e2e-hello-{suffix}",
        image=f"{standing_system.registry_host}/rukpak-e2e/hello-install:{suffix}",
    )
    root = inst.hello_bundle(
        tmp_path / "bundle",
        namespace=h.namespace,
        image=standing_system.busybox_image,
    )
    e2e.push_bundle(root, h.image)
    yield h
    bd = ObjectRef("core.rukpak.io", "v1alpha1", "BundleDeployment", "", h.name)
    system = standing_system
    if system.kube.get(bd) is not None:
        system.kubectl("delete", "bundledeployment", h.name, "--timeout=120s", check=False)
    system.kubectl("delete", "namespace", h.namespace, "--ignore-not-found", "--wait=false")


def install_hello(system: inst.RukpakSystem, hello: Hello) -> dict[str, Any]:
    """Create ``hello``'s BundleDeployment and wait until it is Installed and Healthy; its
    conditions by type."""
    system.kube.create(inst.bundle_deployment(hello.name, hello.image))
    bd = ObjectRef("core.rukpak.io", "v1alpha1", "BundleDeployment", "", hello.name)

    def settled() -> dict[str, Any] | None:
        conds = inst.conditions(system.kube.get(bd))
        ok = all(conds.get(t, {}).get("status") == "True" for t in ("Installed", "Healthy"))
        return conds if ok else None

    try:
        return eventually(settled, timeout=240, what=f"{hello.name} Installed and Healthy")
    except AssertionError as e:
        detail = system.kubectl("describe", "bundledeployment,bundle", check=False)
        raise AssertionError(f"{e}\n{detail}\n{system.describe()}") from None


class TestTheInstalledSystem:
    """Each test stands alone: a BundleDeployment a test needs it creates (``hello``),
    and the leader's deletion ends with the managers rolled out again."""

    def test_every_component_runs_the_one_installed_image(
        self, standing_system: inst.RukpakSystem
    ) -> None:
        system = standing_system
        workloads = [d for d in system.documents() if d["kind"] in ("DaemonSet", "Deployment")]
        names = {d["metadata"]["name"] for d in workloads}
        assert {inst.MANAGER, inst.DAEMONSET} <= names, names
        pods = _pods(system, inst.PART_OF)
        assert pods, system.describe()
        for pod in pods:
            assert _ready(pod), f"{pod['metadata']['name']} not ready\n{system.describe()}"
            images = {c["image"] for c in pod["spec"]["containers"]}
            assert images == {system.image}, (pod["metadata"]["name"], images)
        # the plugin, from the DaemonSet, is what the kubelet lists for the driver
        with e2e.api(system.cluster) as api_client:
            drivers = eventually(
                lambda: e2e.csinode_drivers(api_client, system.cluster.node_name),
                timeout=60,
                what="csi.rukpak.io on the CSINode",
            )
        assert e2e.DRIVER in drivers

    def test_two_manager_replicas_run_and_exactly_one_holds_the_lease(
        self, standing_system: inst.RukpakSystem
    ) -> None:
        system = standing_system
        pods = _pods(system, MANAGER_SELECTOR)
        assert len(pods) == 2 and all(_ready(p) for p in pods), system.describe()
        names = {p["metadata"]["name"] for p in pods}
        holder = eventually(lambda: _holder(system), timeout=60, what="a rukpak-manager holder")
        assert holder in names, (holder, names)
        (standby,) = names - {holder}
        log = system.kubectl("logs", "-n", inst.NAMESPACE, standby)
        assert "msg='taking lease'" in log, log
        assert "msg='manager started'" not in log, log  # it waits; it never reconciles

    def test_the_crd_webhook_carries_the_managers_ca_and_the_local_url(
        self, standing_system: inst.RukpakSystem
    ) -> None:
        system = standing_system
        vwc = ObjectRef(
            "admissionregistration.k8s.io", "v1", "ValidatingWebhookConfiguration", "",
            "rukpak-crd-validator",
        )  # fmt: skip

        def ca_bundle() -> str | None:
            live = system.kube.get(vwc)
            return None if live is None else live["webhooks"][0]["clientConfig"].get("caBundle")

        eventually(ca_bundle, timeout=60, what="the manager to write the webhook's caBundle")
        live = system.kube.get(vwc)
        assert live is not None
        # the host-network component: the API server dials the replicas on the node
        assert live["webhooks"][0]["clientConfig"]["url"] == "https://127.0.0.1:9443/validate-crd"
        secret = ObjectRef("", "v1", "Secret", inst.NAMESPACE, "rukpak-webhook-cert")
        assert system.kube.get(secret) is not None

    def test_a_bundledeployment_becomes_installed_and_healthy(
        self, standing_system: inst.RukpakSystem, hello: Hello
    ) -> None:
        system = standing_system
        conds = install_hello(system, hello)
        assert conds["Installed"]["reason"] == "InstallationSucceeded", conds
        greeting = system.kube.get(
            ObjectRef("", "v1", "ConfigMap", hello.namespace, "hello-greeting")
        )
        assert greeting is not None
        assert greeting["data"]["greeting"] == "Hello from a RukPak bundle"

        table = system.kubectl("get", "bundles,bundledeployments")
        header = " ".join(line for line in table.splitlines() if line.startswith("NAME"))
        for column in ("PHASE", "INSTALL STATE", "HEALTHY", "AGE"):
            assert column in header, table
        # v1alpha2 is the preferred version; v1alpha1's columns and -o wide name the Bundle
        for how in (("bundledeployments.v1alpha1.core.rukpak.io",), ("bd", "-o", "wide")):
            wide = system.kubectl("get", *how, hello.name)
            assert "ACTIVE BUNDLE" in wide and f"{hello.name}-" in wide, wide
        bd_line = next(line for line in table.splitlines() if f"/{hello.name} " in line)
        assert "InstallationSucceeded" in bd_line and "True" in bd_line, table
        assert "Unpacked" in table, table

    def test_the_other_replica_takes_over_when_the_leader_goes(
        self, standing_system: inst.RukpakSystem
    ) -> None:
        system = standing_system
        old = eventually(lambda: _holder(system), timeout=60, what="a rukpak-manager holder")
        system.kubectl("delete", "pod", "-n", inst.NAMESPACE, old, "--wait=false")
        names = {p["metadata"]["name"] for p in _pods(system, MANAGER_SELECTOR)}

        def taken_over() -> str | None:
            holder = _holder(system)
            return holder if holder and holder != old else None

        new = eventually(
            taken_over,
            timeout=90,
            what="another manager replica to take the Lease",
        )
        assert new in names | {p["metadata"]["name"] for p in _pods(system, MANAGER_SELECTOR)}
        inst.rollout(system, [d for d in system.documents() if d["kind"] == "Deployment"],
                     timeout=120)  # fmt: skip

    def test_deleting_the_bundledeployment_removes_what_it_installed(
        self, standing_system: inst.RukpakSystem, hello: Hello
    ) -> None:
        system = standing_system
        install_hello(system, hello)
        installed = (
            ObjectRef("", "v1", "ConfigMap", hello.namespace, "hello-greeting"),
            ObjectRef("apps", "v1", "Deployment", hello.namespace, "hello"),
        )
        assert all(system.kube.get(ref) is not None for ref in installed)
        system.kubectl("delete", "bundledeployment", hello.name, "--timeout=120s", timeout=150)
        for ref in installed:
            gone = functools.partial(lambda r: system.kube.get(r) is None, ref)
            eventually(gone, timeout=60, what=f"{ref} gone")
        bundles, _ = system.kube.list("core.rukpak.io/v1alpha1", "Bundle")
        assert not [b for b in bundles if b["metadata"]["name"].startswith(hello.name)], bundles


def _narrow_account(system: inst.RukpakSystem, name: str, namespace: str) -> None:
    """A ServiceAccount in rukpak-system with the bookkeeping roles and ``admin`` in
    ``namespace`` only: the README's recipe for narrowing a BundleDeployment."""
    sa = {"kind": "ServiceAccount", "name": name, "namespace": inst.NAMESPACE}
    docs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}},
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": name, "namespace": inst.NAMESPACE},
        },
        role_binding(f"{name}-bookkeeping", "rukpak-instance-bookkeeping", [sa]),
        role_binding(
            f"{name}-bookkeeping",
            "rukpak-instance-bookkeeping",
            [sa],
            namespace=inst.NAMESPACE,
            role_kind="Role",
        ),
        role_binding(name, "admin", [sa], namespace=namespace),
    ]
    for doc in docs:
        system.kube.apply(doc)


def healthy(system: inst.RukpakSystem, name: str) -> bool:
    bd = system.kube.get(ObjectRef("core.rukpak.io", "v1alpha1", "BundleDeployment", "", name))
    return inst.conditions(bd).get("Healthy", {}).get("status") == "True"


def _bundle(root: Path, docs: dict[str, dict[str, Any]]) -> Path:
    (root / "manifests").mkdir(parents=True)
    for name, doc in docs.items():
        (root / "manifests" / name).write_text(yaml.safe_dump(doc))
    return root


class TestANarrowServiceAccount:
    """A BundleDeployment's serviceAccountName: its instance can do what that SA may."""

    def test_it_installs_within_its_grant_and_is_refused_beyond_it(
        self, standing_system: inst.RukpakSystem, tmp_path: Path
    ) -> None:
        system = standing_system
        suffix = uuid.uuid4().hex[:6]
        account, namespace = f"narrow-{suffix}", f"e2e-narrow-{suffix}"
        _narrow_account(system, account, namespace)
        inside = _bundle(
            tmp_path / "inside",
            {"01_cm.yaml": {"apiVersion": "v1", "kind": "ConfigMap",
                            "metadata": {"name": "inside", "namespace": namespace}}},
        )  # fmt: skip
        beyond = _bundle(
            tmp_path / "beyond",
            {"01_role.yaml": {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                              "metadata": {"name": f"e2e-beyond-{suffix}"}, "rules": []}},
        )  # fmt: skip
        refs = {}
        for name, root in (("inside", inside), ("beyond", beyond)):
            refs[name] = f"{system.registry_host}/rukpak-e2e/narrow-{name}:{suffix}"
            e2e.push_bundle(root, refs[name])
        names = {k: f"narrow-{k}-{suffix}" for k in refs}
        try:
            for key, name in names.items():
                system.kube.create(
                    inst.bundle_deployment(name, refs[key], serviceAccountName=account)
                )
            bd = functools.partial(ObjectRef, "core.rukpak.io", "v1alpha1", "BundleDeployment", "")

            def installed(name: str, status: str, reason: str = "") -> dict[str, Any] | None:
                cond = inst.conditions(system.kube.get(bd(name))).get("Installed")
                if not cond or cond["status"] != status:
                    return None
                return cond if not reason or cond.get("reason") == reason else None

            try:
                eventually(
                    functools.partial(installed, names["inside"], "True"),
                    timeout=240,
                    what="the bundle within the grant to be Installed",
                )
                refused = eventually(
                    functools.partial(installed, names["beyond"], "False", "InstallFailed"),
                    timeout=240,
                    what="the bundle beyond the grant to fail to install",
                )
            except AssertionError as e:
                detail = system.kubectl("describe", "bundledeployments", check=False)
                raise AssertionError(f"{e}\n{detail}\n{system.describe()}") from None
            assert "forbidden" in refused["message"].lower(), refused
            # applied as that account (the standing provisioner impersonates it): the API
            # server names it in its refusal
            assert f"system:serviceaccount:{inst.NAMESPACE}:{account}" in refused["message"]
            # Installed=True may precede the end of the first apply by moments
            inside_cm = ObjectRef("", "v1", "ConfigMap", namespace, "inside")
            try:
                eventually(lambda: system.kube.get(inside_cm), timeout=60, what=str(inside_cm))
            except AssertionError as e:
                log = inst.provisioner_log(system)
                raise AssertionError(f"{e}\nprovisioner log:\n{log}") from None
            role = ObjectRef(
                "rbac.authorization.k8s.io", "v1", "ClusterRole", "", f"e2e-beyond-{suffix}"
            )
            assert system.kube.get(role) is None
            # the manager watches what it installed as that account, in its namespace only
            # (the account may not list ConfigMaps cluster-wide): Healthy comes from there
            eventually(
                functools.partial(healthy, system, names["inside"]),
                timeout=120,
                what="the narrow install to be Healthy (read as its own account)",
            )
            # and uninstalls as it: the ConfigMap goes with the BundleDeployment
            system.kubectl("delete", "bundledeployment", names["inside"], "--timeout=120s",
                           timeout=150)  # fmt: skip
            eventually(
                lambda: system.kube.get(inside_cm) is None,
                timeout=60,
                what=f"{inside_cm} deleted by the uninstall",
            )
        finally:
            for name in names.values():
                system.kubectl("delete", "bundledeployment", name, "--ignore-not-found",
                               "--timeout=120s", timeout=150, check=False)  # fmt: skip
            system.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
            system.kubectl("delete", "serviceaccount", account, "-n", inst.NAMESPACE, check=False)
            system.kubectl("delete", "clusterrolebinding", f"{account}-bookkeeping", check=False)
            system.kubectl("delete", "rolebinding", f"{account}-bookkeeping", "-n",
                           inst.NAMESPACE, check=False)  # fmt: skip
