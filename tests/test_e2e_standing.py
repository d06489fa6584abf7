"""End to end: the standing provisioner (``deploy/standing``) on the local kubelet.

The installed system (``rukpak_system``, a pod per change: ``run-pods``) is switched to the
default install by applying the same overlay without ``run-pods`` (``standing_system``: the
manager's ``--run-mode=standing`` and the ``rukpak-provisioner`` Deployment, which mounts
the node plugin's store volume). Checked here:

- an install and an upgrade of a v1alpha2 BundleDeployment start no pod: each run is a
  run ConfigMap the standing provisioner takes, fetching the image by digest through the
  store volume and applying as the run's ServiceAccount;
- content the node store cannot serve fails the BundleDeployment with a condition that
  says so, and the provisioner goes on serving the others;
- several sources (v1alpha2 ``spec.sources``) install together, no pod;
- git, http and ConfigMaps sources run standing too (``test_e2e_sources``, on the same
  switched system);
- a v1alpha1 BundleDeployment: its Bundle's unpack check and its install run standing, no
  pod; an invalid Bundle fails its check with upstream's words, no pod;
- a provisioner killed (SIGKILL) while it holds a run loses nothing: the container kubelet
  restarts takes the run once the claim is stale, and installs.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from provisioner.engine.objects import ObjectRef
from provisioner.instance import runrecord
from provisioner.manager import model
from provisioner.manager.acting import actuate
from provisioner.runtime import lease
from tests import bundles, csi_helpers
from tests import e2e_helpers as e2e
from tests import install_helpers as inst
from tests.polling import eventually
from tests.test_e2e_v1alpha2 import create_of_sources, push_split_hello

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SUFFIX = uuid.uuid4().hex[:6]
PROVISIONER = ("-n", inst.NAMESPACE, "deployment/rukpak-provisioner")


@pytest.fixture(scope="module", name="system")
def _system(standing_system: inst.RukpakSystem) -> inst.RukpakSystem:
    """The installed system switched to the standing provisioner: every test's."""
    return standing_system


def explain(system: inst.RukpakSystem, name: str) -> str:
    """What a failing standing test needs to say: the BundleDeployment's conditions, its
    run ConfigMaps and the standing provisioner's last log lines."""
    conditions = inst.conditions(system.kube.get(actuate.bd_ref(name, model.API_VERSION_V2)))
    items, _ = system.kube.list(
        "v1", "ConfigMap", namespace=inst.NAMESPACE, label_selector=runrecord.RUN_LABEL
    )
    maps = [(i["metadata"]["name"], i["metadata"].get("annotations"), i.get("data", {}).get(
        runrecord.MESSAGE_KEY)) for i in items]  # fmt: skip
    logs = system.kubectl(*PROVISIONER[:2], "logs", PROVISIONER[2], "--tail=40", check=False)
    return f"conditions={conditions}\nruns={maps}\nprovisioner logs:\n{logs}"


def wait(
    system: inst.RukpakSystem,
    name: str,
    check: Callable[[], object],
    what: str,
    timeout: float = 120,
) -> Any:
    try:
        return eventually(check, timeout=timeout, what=what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{explain(system, name)}") from None


def instance_pods_scheduled(system: inst.RukpakSystem, name: str) -> list[str]:
    """The instance run pods of ``name`` the scheduler ever placed (Scheduled events)."""
    out = system.kubectl(
        "get", "events", "-n", inst.NAMESPACE, "--field-selector", "reason=Scheduled",
        "-o", "jsonpath={range .items[*]}{.involvedObject.name}{'\\n'}{end}",
    )  # fmt: skip
    prefix = f"{model.instance_name(name)}-"
    return [line for line in out.splitlines() if line.startswith(prefix)]


def provisioner_log(system: inst.RukpakSystem) -> str:
    return system.kubectl(*PROVISIONER[:2], "logs", PROVISIONER[2], timeout=30)


def installed(system: inst.RukpakSystem, name: str) -> str:
    status, reason, message = inst.cond_v2(system, name, "Installed")
    return message if (status, reason) == ("True", "InstallationSucceeded") else ""


def push_hello(system: inst.RukpakSystem, root: Path, tag: str, ns: str, text: str) -> str:
    inst.hello_bundle(root, namespace=ns, image=system.busybox_image, greeting=text)
    ref = f"{system.registry_host}/e2e-standing-{SUFFIX}/hello:{tag}"
    e2e.push_bundle(root, ref)
    return ref


def test_an_install_and_an_upgrade_start_no_pod(system: inst.RukpakSystem, tmp_path: Path) -> None:
    name = ns = f"standing-{SUFFIX}"
    first = push_hello(system, tmp_path / "v1", "v1", ns, "standing one")
    second = push_hello(system, tmp_path / "v2", "v2", ns, "standing two")
    system.kube.create(inst.bd_v2(name, first))
    try:
        wait(system, name, lambda: installed(system, name), f"{name} Installed")
        assert inst.greeting(system, ns) == "standing one"
        assert f"run={model.instance_name(name)}-" in provisioner_log(system), "not run here"
        assert instance_pods_scheduled(system, name) == [], "a pod was started to install"
        patch = {"spec": {"source": {"type": "image", "image": {"ref": second}}}}
        system.kube.merge_patch(actuate.bd_ref(name, model.API_VERSION_V2), patch)
        wait(system, name, lambda: inst.greeting(system, ns) == "standing two", "upgraded")
        wait(system, name, lambda: installed(system, name), "Installed again")
        assert instance_pods_scheduled(system, name) == [], "a pod was started for a change"
    finally:
        inst.delete_v2(system, name)


def test_several_sources_install_together_with_no_pod(
    system: inst.RukpakSystem, tmp_path: Path
) -> None:
    """v1alpha2 ``spec.sources``: each source asked of the store volume, shown to the
    instance at its destination."""
    name = ns = f"standing-multi-{SUFFIX}"
    create_of_sources(system, name, push_split_hello(system, tmp_path, ns, "standing-multi"))
    try:
        wait(system, name, lambda: installed(system, name), f"{name} Installed")
        assert inst.greeting(system, ns) == "Hello from a RukPak bundle"
        assert system.kube.get(ObjectRef("apps", "v1", "Deployment", ns, "hello")) is not None
        assert instance_pods_scheduled(system, name) == [], "a pod was started to install"
    finally:
        inst.delete_v2(system, name)


GOOD = 50


def _entries(docs: str) -> list[csi_helpers.Entry]:
    return [("manifests/", "dir"), ("manifests/all.yaml", "file", docs.encode())]


def _good(ns: str) -> str:
    return (
        f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n---\n"
        f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: good, namespace: {ns}}}\n"
        "data: {fine: 'yes'}\n"
    )


def _alias_bomb() -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 12)]
    body = "\n".join("  " + line for line in lines)
    head = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: bomb, namespace: default}\n"
    return f"{head}data:\n{body}\n"


def _many_objects(count: int) -> str:
    return "".join(
        f"---\napiVersion: v1\nkind: ConfigMap\nmetadata: {{name: m{i}, namespace: default}}\n"
        for i in range(count)
    )


def _restarts(system: inst.RukpakSystem) -> int:
    pods, _ = system.kube.list(
        "v1",
        "Pod",
        namespace=inst.NAMESPACE,
        label_selector="app.kubernetes.io/name=rukpak-provisioner",
    )
    return sum(
        int(s.get("restartCount") or 0)
        for p in pods
        for s in (p.get("status") or {}).get("containerStatuses") or []
    )


def test_hostile_bundles_beside_fifty_good_ones_fail_by_name_and_every_good_one_installs(
    system: inst.RukpakSystem,
) -> None:
    """An alias bomb and a bundle of 100,000 objects, created first, beside 50 good
    bundles: each hostile one fails with a condition naming why, every good one is
    Installed, and the provisioner that loaded them all in one process never restarted."""
    repo = f"e2e-standing-{SUFFIX}/many"
    hostile = {
        f"st-bomb-{SUFFIX}": (_alias_bomb(), "excessive aliasing"),
        f"st-huge-{SUFFIX}": (_many_objects(100_000), "holds 100000 objects, more than"),
    }
    goods = {f"st-good-{SUFFIX}-{i}": f"st-good-{SUFFIX}-{i}" for i in range(GOOD)}
    refs = {
        name: csi_helpers.push_image(system.registry_host, repo, name, [_entries(docs)]).ref
        for name, (docs, _) in hostile.items()
    }
    refs |= {
        name: csi_helpers.push_image(system.registry_host, repo, name, [_entries(_good(ns))]).ref
        for name, ns in goods.items()
    }
    restarts = _restarts(system)
    try:
        for name in [*hostile, *goods]:
            system.kube.create(inst.bd_v2(name, refs[name]))

        def settled() -> tuple[int, dict[str, str]] | None:
            ok = sum(1 for name in goods if installed(system, name))
            failed = {  # failed for good: a run still going is InstallPending
                name: message
                for name in hostile
                for status, reason, message in [inst.cond_v2(system, name, "Installed")]
                if status == "False" and reason != "InstallPending"
            }
            return (ok, failed) if ok == GOOD and len(failed) == len(hostile) else None

        _, failed = wait(
            system, next(iter(hostile)), settled, "good ones Installed, bad ones failed", 240
        )
        for name, (_, words) in hostile.items():
            assert words in failed[name], failed
        for ns in list(goods.values())[:: GOOD // 5]:
            assert system.kube.get(ObjectRef("", "v1", "ConfigMap", ns, "good")) is not None
        assert _restarts(system) == restarts, "the provisioner restarted"
    finally:
        for name in [*hostile, *goods]:
            system.kubectl("delete", inst.BDS_V2, name, "--wait=false", check=False)
        left = {*hostile, *goods}

        def all_gone() -> bool:
            for name in sorted(left):
                if system.kube.get(actuate.bd_ref(name, model.API_VERSION_V2)) is None:
                    left.discard(name)
            return not left

        eventually(all_gone, timeout=240, what="every BundleDeployment of the test deleted")


def test_content_the_store_cannot_serve_fails_with_a_condition_and_others_still_install(
    system: inst.RukpakSystem, tmp_path: Path
) -> None:
    good = ns = f"standing-ok-{SUFFIX}"
    bad = f"standing-missing-{SUFFIX}"
    ref = push_hello(system, tmp_path / "ok", "ok", ns, "still served")
    missing = f"{system.registry_host}/e2e-standing-{SUFFIX}/hello@sha256:{'0' * 64}"
    system.kube.create(inst.bd_v2(bad, missing))
    system.kube.create(inst.bd_v2(good, ref))
    try:
        wait(system, good, lambda: installed(system, good), f"{good} Installed")

        def failed() -> str:
            status, _reason, message = inst.cond_v2(system, bad, "Installed")
            return message if status == "False" and "node store" in message else ""

        message = wait(system, bad, failed, f"{bad} failing")
        assert missing.split("@")[1] in message or "not found" in message.lower(), message
        assert instance_pods_scheduled(system, bad) == []
    finally:
        inst.delete_v2(system, good, bad)


def test_the_standing_provisioner_serves_from_its_store_volume(
    system: inst.RukpakSystem,
) -> None:
    pods = system.kube.list(
        "v1", "Pod", namespace=inst.NAMESPACE,
        label_selector="app.kubernetes.io/name=rukpak-provisioner",
    )[0]  # fmt: skip
    assert len(pods) == 1, pods
    spec = pods[0]["spec"]
    store = next(v for v in spec["volumes"] if v["name"] == "store")
    assert store["csi"]["volumeAttributes"] == {"kind": "store"}
    mount = next(m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "store")
    assert mount["mountPropagation"] == "HostToContainer"
    logs = system.kubectl(*PROVISIONER[:2], "logs", PROVISIONER[2], timeout=30)
    assert "serving runs" in logs


def kill_9(pod_name: str) -> int:
    """SIGKILL the standing provisioner process of pod ``pod_name`` on this node (found by
    its command and the POD_NAME in its environment); its pid."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"standing" in argv and f"POD_NAME={pod_name}".encode() in environ:
            os.kill(int(proc.name), signal.SIGKILL)
            return int(proc.name)
    raise AssertionError(f"no standing provisioner process of pod {pod_name} on this node")


def scheduled_in_system(system: inst.RukpakSystem, prefix: str) -> list[str]:
    """Pods in rukpak-system whose name starts with ``prefix`` that the scheduler placed."""
    out = system.kubectl(
        "get", "events", "-n", inst.NAMESPACE, "--field-selector", "reason=Scheduled",
        "-o", "jsonpath={range .items[*]}{.involvedObject.name}{'\\n'}{end}",
    )  # fmt: skip
    return [line for line in out.splitlines() if line.startswith(prefix)]


def test_a_v1alpha1_install_checks_its_bundle_and_installs_with_no_pod(
    system: inst.RukpakSystem, tmp_path: Path
) -> None:
    name = ns = f"standing-v1-{SUFFIX}"
    ref = push_hello(system, tmp_path / "v1", "v1alpha1", ns, "checked without a pod")
    system.kube.create(inst.bundle_deployment(name, ref))
    bd = actuate.bd_ref(name)
    try:

        def installed_v1() -> bool:
            conds = inst.conditions(system.kube.get(bd))
            return (conds.get("Installed") or {}).get("status") == "True"

        wait(system, name, installed_v1, f"{name} Installed")
        assert inst.greeting(system, ns) == "checked without a pod"
        owned, _ = system.kube.list(
            model.API_VERSION, model.BUNDLE, label_selector=f"{model.OWNER_NAME_LABEL}={name}"
        )
        (bundle,) = owned
        unpacked = inst.conditions(bundle)["Unpacked"]
        assert unpacked["reason"] == "UnpackSuccessful", unpacked
        assert "Successfully unpacked" in unpacked["message"]
        logs = provisioner_log(system)
        assert f"run={bundle['metadata']['name']}" in logs, "the check did not run here"
        assert scheduled_in_system(system, bundle["metadata"]["name"]) == []
        assert instance_pods_scheduled(system, name) == []
    finally:
        system.kubectl("delete", "bundledeployments.core.rukpak.io", name, timeout=150)


def test_an_invalid_v1alpha1_bundle_fails_its_check_in_upstreams_words_with_no_pod(
    system: inst.RukpakSystem, tmp_path: Path
) -> None:
    del tmp_path  # `rukpak bundle build` refuses an empty bundle: pushed by hand
    ref = csi_helpers.push_image(
        system.registry_host, f"e2e-standing-{SUFFIX}/empty", "v1", [[("manifests/", "dir")]]
    ).ref
    name = f"standing-empty-{SUFFIX}"
    system.kube.create(bundles.bundle_doc(name, ref))
    bundle = actuate.bundle_ref(name)
    try:

        def failing() -> str:
            unpacked = inst.conditions(system.kube.get(bundle)).get("Unpacked") or {}
            return str(unpacked.get("message") or "") if unpacked.get("status") == "False" else ""

        message = wait(system, name, failing, f"{name} failing its check")
        assert "found zero objects: plain+v0 bundles are required to contain at least" in message
        assert scheduled_in_system(system, name) == []
    finally:
        system.kube.delete(bundle)


def test_a_provisioner_killed_mid_run_loses_nothing_the_next_one_finishes_it(
    system: inst.RukpakSystem, tmp_path: Path
) -> None:
    """kill -9 of the provisioner holding a run: the run stays Running, its claim goes stale,
    and the provisioner kubelet restarts takes it and installs. The run is held mid-way
    deterministically: the BundleDeployment's Lease is held by someone else until the kill."""
    name = ns = f"standing-kill-{SUFFIX}"
    ref = push_hello(system, tmp_path / "k", "kill", ns, "survived a kill")
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    held = ObjectRef("coordination.k8s.io", "v1", "Lease", inst.NAMESPACE, lease.lease_name(name))
    system.kube.create(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": held.name, "namespace": inst.NAMESPACE},
            "spec": {
                "holderIdentity": "someone-else",
                "leaseDurationSeconds": 3600,
                "acquireTime": now,
                "renewTime": now,
            },
        }
    )
    system.kube.create(inst.bd_v2(name, ref))
    try:

        def claimed() -> str:
            items, _ = system.kube.list(
                "v1", "ConfigMap", namespace=inst.NAMESPACE,
                label_selector=f"{runrecord.RUN_LABEL},{model.BD_LABEL}={name}",
            )  # fmt: skip
            for cm in items:
                annotations = cm["metadata"].get("annotations") or {}
                if annotations.get(runrecord.PHASE) == "Running":
                    return str(annotations.get(runrecord.HOLDER) or "")
            return ""

        holder = wait(system, name, claimed, f"{name}'s run claimed")
        killed = kill_9(holder)  # the process in the pod, as a node's OOM killer would
        system.kube.delete(held)  # the Lease is free: whoever takes the run can install
        wait(system, name, lambda: installed(system, name), f"{name} Installed after the kill")
        assert inst.greeting(system, ns) == "survived a kill"
        assert instance_pods_scheduled(system, name) == []

        def restarted_and_ran() -> bool:  # the container kubelet restarted took the run
            log = system.kubectl(
                "logs", "-n", inst.NAMESPACE, holder, check=False, timeout=30
            )  # fmt: skip
            return f"run={model.instance_name(name)}-" in log

        wait(system, name, restarted_and_ran, "the restarted provisioner's log naming the run")
        pod = system.kube.get(ObjectRef("", "v1", "Pod", inst.NAMESPACE, holder)) or {}
        restarts = [c.get("restartCount", 0) for c in pod["status"]["containerStatuses"]]
        assert restarts and restarts[0] >= 1, (killed, pod.get("status"))
    finally:
        system.kube.delete(held)
        inst.delete_v2(system, name)
