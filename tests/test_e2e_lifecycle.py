"""End to end: revisions, offline rollback, progress deadlines and dependencies of
v1alpha2 BundleDeployments on the local kubelet, from the manifests users apply: the
default install (``standing_system``), every run taken by the standing provisioner and no
pod started for any change (``install_helpers`` checks that after each test).

Each rollback test pushes its bundles to a registry of its own (a real docker-registry on
loopback), then stops that registry before going back: the kept revision must come from
the node cache alone. Checked here:

- every installed change is a revision in ``status.revisions``; ``rukpak history`` lists
  them; ``rukpak rollback`` reinstalls the previous one with its registry stopped, and
  the next spec change ends the rollback;
- a revision that is not Installed and Healthy within ``progressDeadlineSeconds`` turns
  ``Progressing`` False (ProgressDeadlineExceeded) and, with ``rollbackOnFailure``, the
  previous revision comes back from the node cache, registry stopped;
- a git BundleDeployment rolls back through an instance run (the manager restarted)
  taken by the standing provisioner, with its git server stopped: the node plugin
  retains both commits' trees;
- ``dependsOn``: a chain of three installs in order, each waiting with
  ``DependencyNotReady`` naming what it waits for; a write closing a cycle is refused
  at admission naming its path;
  deleting the chain at once deletes it in reverse order.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from provisioner.engine.apply import inventory
from provisioner.engine.objects import Obj, ObjectRef
from provisioner.manager import model
from provisioner.manager.acting import actuate
from provisioner.manager.planning import runs
from rukpak.common import errors
from tests import bundles
from tests import e2e_helpers as e2e
from tests import install_helpers as inst
from tests.polling import eventually
from tests.registry import RegistryServer
from tests.source_servers import commit, make_repo, serving

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SUFFIX = uuid.uuid4().hex[:6]
bd_v2, live, cond, greeting = inst.bd_v2, inst.live_v2, inst.cond_v2, inst.greeting


@pytest.fixture
def own_registry(tmp_path: Path) -> Iterator[RegistryServer]:
    """A registry only this test uses (it stops it half way)."""
    server = RegistryServer.start(tmp_path / "registry")
    try:
        yield server
    finally:
        server.stop()


def status(system: inst.RukpakSystem, name: str) -> Obj:
    return live(system, name).get("status") or {}


def push(
    system: inst.RukpakSystem,
    registry: RegistryServer,
    root: Path,
    tag: str,
    ns: str,
    text: str,
    *,
    image: str = "",
) -> str:
    inst.hello_bundle(root, namespace=ns, image=image or system.busybox_image, greeting=text)
    ref = f"{registry.host}/lifecycle-{SUFFIX}/hello:{tag}"
    e2e.push_bundle(root, ref)
    return ref


def rukpak(system: inst.RukpakSystem, *args: str, timeout: float = 180) -> str:
    tool = Path(sys.executable).parent / "rukpak"
    done = subprocess.run(
        [str(tool), *args, "--kubeconfig", str(system.kubeconfig)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert done.returncode == 0, f"rukpak {' '.join(args)}: {done.stdout}\n{done.stderr}"
    return done.stdout


def ready(system: inst.RukpakSystem, name: str, revision: int) -> bool:
    current = status(system, name)
    return (
        current.get("installedRevision") == revision
        and cond(system, name, "Installed")[0] == "True"
        and cond(system, name, "Healthy")[0] == "True"
    )


def set_ref(system: inst.RukpakSystem, name: str, ref: str, **spec: object) -> None:
    patch = {"spec": {"source": {"type": "image", "image": {"ref": ref}}, **spec}}
    system.kube.merge_patch(actuate.bd_ref(name, model.API_VERSION_V2), patch)


def install_then_change(
    system: inst.RukpakSystem,
    registry: RegistryServer,
    workdir: Path,
    name: str,
    greetings: tuple[str, str],
    *,
    then_image: str = "",
    **spec: object,
) -> None:
    """Push the hello bundle (namespace ``name``) to ``registry`` twice, tagged by its
    ``greetings``, the second running ``then_image`` when given; create the BundleDeployment
    ``name`` of the first (with more ``spec``), wait until that is installed as revision 1,
    then change its source to the second."""
    first, then = greetings
    first_ref = push(system, registry, workdir / first, first, name, first)
    then_ref = push(system, registry, workdir / then, then, name, then, image=then_image)
    system.kube.create(bd_v2(name, first_ref, **spec))
    eventually(lambda: ready(system, name, 1), timeout=180, what="revision 1 installed")
    set_ref(system, name, then_ref)


def events_about(system: inst.RukpakSystem, namespace: str, name: str) -> str:
    """The events about object ``name`` in ``namespace`` (kubectl's table; "" for none)."""
    return system.kubectl(
        "get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={name}",
        "--ignore-not-found",
    ).strip()  # fmt: skip


def events_of(system: inst.RukpakSystem, name: str, reason: str) -> str:
    """The events about BundleDeployment ``name`` with ``reason``, as a table."""
    return system.kubectl(
        "get", "events", "-n", "default", "--field-selector",
        f"involvedObject.name={name},reason={reason}",
    )  # fmt: skip


def install_record(system: inst.RukpakSystem, name: str) -> runs.InstallRecord | None:
    cm = ObjectRef("", "v1", "ConfigMap", inst.NAMESPACE, inventory.configmap_name(name))
    return runs.InstallRecord.of_inventory(system.kube.get(cm))


def gone(system: inst.RukpakSystem, name: str) -> bool:
    return not live(system, name)


def delete(system: inst.RukpakSystem, *names: str) -> None:
    system.kubectl("delete", inst.BDS_V2, *names, "--wait=false")
    for name in names:
        eventually(functools.partial(gone, system, name), timeout=180, what=f"{name} deleted")


def test_rollback_reinstalls_the_previous_revision_with_the_registry_stopped(
    standing_system: inst.RukpakSystem, own_registry: RegistryServer, tmp_path: Path
) -> None:
    system = standing_system
    name = ns = f"rollback-{SUFFIX}"
    install_then_change(system, own_registry, tmp_path, name, ("one", "two"))
    eventually(lambda: ready(system, name, 2), timeout=180, what="revision 2 installed")
    assert greeting(system, ns) == "two"
    history = rukpak(system, "history", name)
    assert "1-" in history and "2*" in history, history
    kept = status(system, name)["revisions"]
    assert [r["outcome"] for r in kept] == ["Installed", "Installed"]
    assert kept[0]["source"]["image"]["ref"].startswith(f"{own_registry.host}/")
    assert "@sha256:" in kept[0]["source"]["image"]["ref"]

    own_registry.stop()  # from here on, nothing can be fetched
    out = rukpak(system, "rollback", name, "--wait", "150")
    assert "revision 1 installed" in out, out
    eventually(lambda: ready(system, name, 1), timeout=120, what="revision 1 healthy again")
    assert greeting(system, ns) == "one"
    # and no pod was needed: the manager re-applied what it kept of revision 1, and the
    # record names the run that would have installed it, which never existed
    reverted = events_of(system, name, "RevertedWithoutRun")
    assert "went back to" in reverted and "no instance run" in reverted, reverted
    record = install_record(system, name)
    assert record is not None and record.bundle == kept[0]["name"]
    assert not system.kube.get(ObjectRef("", "v1", "Pod", inst.NAMESPACE, record.by))
    assert not events_about(system, inst.NAMESPACE, record.by), "the run pod existed"
    assert not inst.taken_standing(system, record.by), "a standing provisioner ran it"
    assert status(system, name)["previousRevision"] == 2
    assert cond(system, name, "Progressing")[1] == "RolledBack"
    # the next spec change ends the rollback; naming revision 2 by digest needs no registry
    # either (a tag would: it cannot be resolved while the registry is down)
    set_ref(system, name, kept[1]["source"]["image"]["ref"], revisionHistoryLimit=4)
    eventually(lambda: greeting(system, ns) == "two", timeout=180, what="the rollback ended")
    delete(system, name)


def hello_files(system: inst.RukpakSystem, root: Path, ns: str, text: str) -> dict[str, str]:
    """The hello bundle greeting ``text``, as files under ``hello/`` of a repository."""
    inst.hello_bundle(root, namespace=ns, image=system.busybox_image, greeting=text)
    return {f"hello/manifests/{p.name}": p.read_text() for p in (root / "manifests").iterdir()}


def retained_by(system: inst.RukpakSystem, owner: str) -> list[str]:
    """The tree digests the node plugin's cache retains for ``owner`` (its state file)."""
    state = json.loads((system.state_dir / "images" / "state.json").read_text())
    entry = (state.get("retained") or {}).get(owner) or {}
    return list(entry.get("digests") or [])


def test_a_git_bundle_rolls_back_through_a_run_with_its_git_server_stopped(
    standing_system: inst.RukpakSystem, tmp_path: Path
) -> None:
    """The run path of a rollback (a restarted manager kept no objects) for git content:
    the standing provisioner asks the node store for the commit's tree, served from the node
    cache, which retains both commits' trees for the BundleDeployment."""
    system = standing_system
    name, ns = f"git-rollback-{SUFFIX}", f"git-rollback-{SUFFIX}"
    repo = tmp_path / "repos" / "hello.git"
    commits = [make_repo(repo, hello_files(system, tmp_path / "one", ns, "one"))]
    commits.append(commit(repo, hello_files(system, tmp_path / "two", ns, "two")))
    with serving(tmp_path / "repos") as server:

        def source(commit_hash: str) -> Obj:
            git = {"repository": server.repo_url("hello.git"), "directory": "./hello"}
            return {"type": "git", "git": {**git, "ref": {"commit": commit_hash}}}

        manifest = bd_v2(name, "unused")
        manifest["spec"]["source"] = source(commits[0])
        system.kube.create(manifest)
        eventually(lambda: ready(system, name, 1), timeout=180, what="revision 1 installed")
        bd = actuate.bd_ref(name, model.API_VERSION_V2)
        system.kube.merge_patch(bd, {"spec": {"source": source(commits[1])}})
        eventually(lambda: ready(system, name, 2), timeout=180, what="revision 2 installed")
        assert greeting(system, ns) == "two"
    # the git server is gone from here on
    kept = status(system, name)["revisions"]
    assert [r["source"]["git"]["ref"]["commit"] for r in kept] == commits
    owner = f"bundledeployment/{name}/{live(system, name)['metadata']['uid']}"
    assert len(retained_by(system, owner)) == 2, "both commits' trees are retained"

    try:
        inst.restart_managers(system)
        out = rukpak(system, "rollback", name, "--wait", "180", timeout=240)
        assert "revision 1 installed" in out, out
        eventually(lambda: ready(system, name, 1), timeout=120, what="revision 1 healthy again")
        assert greeting(system, ns) == "one"
        assert "RevertedWithoutRun" not in events_of(system, name, "RevertedWithoutRun")
        record = install_record(system, name)
        assert record is not None and record.bundle == kept[0]["name"]
        assert inst.taken_standing(system, record.by), "the standing provisioner installed it"
    finally:  # a rolled-back BundleDeployment left behind would count in later tests' metrics
        delete(system, name)


def test_a_missed_progress_deadline_rolls_back_from_the_node_cache(
    standing_system: inst.RukpakSystem, own_registry: RegistryServer, tmp_path: Path
) -> None:
    system = standing_system
    name = ns = f"deadline-{SUFFIX}"
    install_then_change(
        system,
        own_registry,
        tmp_path,
        name,
        ("good", "bad"),
        then_image="127.0.0.1:9/none:0",  # bad cannot pull it: installed, never Healthy
        progressDeadlineSeconds=25,
        rollbackOnFailure=True,
    )
    eventually(
        lambda: status(system, name).get("installedRevision") == 2,
        timeout=180,
        what="revision 2 applied",
    )
    own_registry.stop()
    progressing = eventually(
        lambda: c if (c := cond(system, name, "Progressing"))[0] == "False" else None,
        timeout=120,
        what="the deadline",
    )
    assert progressing[1] == "ProgressDeadlineExceeded"
    assert "revision 2 did not become Installed and Healthy within 25s" in progressing[2]
    eventually(lambda: ready(system, name, 1), timeout=180, what="rolled back to revision 1")
    assert greeting(system, ns) == "good"
    assert "rolled back to revision 1" in cond(system, name, "Progressing")[2]
    assert "RollingBack" in events_of(system, name, "RollingBack")
    delete(system, name)


def test_depends_on_installs_a_chain_in_order_refuses_a_cycle_and_deletes_in_reverse(
    standing_system: inst.RukpakSystem, tmp_path: Path
) -> None:
    system = standing_system
    names = [f"chain-{i}-{SUFFIX}" for i in range(3)]
    refs = []
    for index, bd_name in enumerate(names):
        ns = bd_name
        inst.hello_bundle(
            tmp_path / bd_name, namespace=ns, image=system.busybox_image, greeting=str(index)
        )
        ref = f"{system.registry_host}/lifecycle-{SUFFIX}/{bd_name}:v1"
        e2e.push_bundle(tmp_path / bd_name, ref)
        refs.append(ref)
    # created last-first: each waits for the one before it
    for index in (2, 1):
        system.kube.create(bd_v2(names[index], refs[index], dependsOn=[{"name": names[index - 1]}]))

    def chain_waiting() -> tuple[str, str, str] | None:
        found = cond(system, names[2], "Installed")
        return found if found[1] == "DependencyNotReady" else None

    waiting = eventually(chain_waiting, timeout=60, what="chain-2 waiting")
    assert names[1] in waiting[2]
    # chain-1 may be looked at after chain-2: wait for its own verdict too
    eventually(
        lambda: cond(system, names[1], "Installed")[1] == "DependencyNotReady",
        timeout=60,
        what="chain-1 waiting",
    )
    assert f"{names[0]}: not found" in cond(system, names[1], "Installed")[2]
    system.kube.create(bd_v2(names[0], refs[0]))
    for bd_name in names:
        eventually(functools.partial(ready, system, bd_name, 1), timeout=240, what=bd_name)
    times = [status(system, n)["revisions"][0]["installedAt"] for n in names]
    assert times == sorted(times)

    loop_a, loop_b = f"loop-a-{SUFFIX}", f"loop-b-{SUFFIX}"
    system.kube.create(bd_v2(loop_a, refs[0], dependsOn=[{"name": loop_b}]))
    # the manager's webhook refuses the write that closes the cycle, naming it (a cycle
    # written while no manager answers is a DependencyCycle condition: test_dependency_order)
    with pytest.raises(errors.RukpakError) as caught:
        system.kube.create(bd_v2(loop_b, refs[0], dependsOn=[{"name": loop_a}]))
    assert f"spec.dependsOn closes a cycle: {loop_b} -> {loop_a} -> {loop_b}" in (
        caught.value.message
    )
    eventually(
        lambda: f"{loop_b}: not found" in cond(system, loop_a, "Installed")[2],
        timeout=60,
        what="loop-a waiting for loop-b",
    )

    # deleting everything at once: dependents go first, the root waits and says so
    system.kubectl("delete", inst.BDS_V2, *names, loop_a, "--wait=false")

    for bd_name in names:
        eventually(functools.partial(gone, system, bd_name), timeout=180, what=f"{bd_name} gone")
    eventually(functools.partial(gone, system, loop_a), timeout=180, what=f"{loop_a} deleted")
    # the root waited while the one that depends on it existed, and said so. Read from its
    # event, after the fact: its Deleting condition said it for as long as the chain took to
    # go, which may be less than a poll of the live object takes.
    waited = eventually(
        lambda: events_of(system, names[0], "WaitingForDependents"),
        timeout=60,
        what="chain-0's WaitingForDependents event",
    )
    assert names[1] in waited and "go first" in waited, waited


def test_a_health_check_fails_naming_its_object_then_passes(
    standing_system: inst.RukpakSystem, tmp_path: Path
) -> None:
    system = standing_system
    name, ns = f"checked-{SUFFIX}", f"checked-{SUFFIX}"
    inst.hello_bundle(tmp_path / "b", namespace=ns, image=system.busybox_image, greeting="one")
    ref = f"{system.registry_host}/lifecycle-{SUFFIX}/checked:v1"
    e2e.push_bundle(tmp_path / "b", ref)

    def checks(want: str) -> list[Obj]:
        return [
            {
                "name": "greeting",
                "selector": {"kind": "ConfigMap", "name": "hello-greeting"},
                "assertions": [{"field": {"path": ".data.greeting", "equals": want}}],
                "periodSeconds": 1,
                "failureThreshold": 1,
            },
            {
                "name": "rolled-out",
                "selector": {"group": "apps", "kind": "Deployment"},
                "assertions": [{"cel": "object.status.availableReplicas == object.spec.replicas"}],
                "periodSeconds": 1,
            },
        ]

    system.kube.create(bd_v2(name, ref, healthChecks=checks("two")))

    def unhealthy() -> tuple[str, str, str] | None:
        found = cond(system, name, "Healthy")
        return found if found[0] == "False" and "greeting" in found[2] else None

    verdict = eventually(unhealthy, timeout=180, what="the failing check")
    assert verdict[1] == "Unhealthy"
    assert f"ConfigMap {ns}/hello-greeting" in verdict[2]
    assert "want" in verdict[2] and '"two"' in verdict[2], verdict
    system.kube.merge_patch(
        actuate.bd_ref(name, model.API_VERSION_V2), {"spec": {"healthChecks": checks("one")}}
    )
    passed = eventually(
        lambda: c if (c := cond(system, name, "Healthy"))[0] == "True" else None,
        timeout=120,
        what="the checks passing",
    )
    assert "2 health check(s) pass" in passed[2]
    delete(system, name)


def secret_reader_bundle(root: Path, ns: str, *, exec_too: bool = False) -> Path:
    """A bundle whose ClusterRole grants every verb on secrets (and, with ``exec_too``,
    exec into pods), bound to its ServiceAccount."""
    rules: list[Obj] = [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["*"]}]
    if exec_too:
        rules.append({"apiGroups": [""], "resources": ["pods/exec"], "verbs": ["create"]})
    docs: list[Obj] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": "reader", "namespace": ns},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": f"{ns}-secrets"},
            "rules": rules,
        },
        bundles.role_binding(
            f"{ns}-secrets",
            f"{ns}-secrets",
            [{"kind": "ServiceAccount", "name": "reader", "namespace": ns}],
        ),
    ]
    manifests = root / "manifests"
    manifests.mkdir(parents=True)
    for index, doc in enumerate(docs):
        (manifests / f"{index:02d}.yaml").write_text(yaml.safe_dump(doc))
    return root


def test_a_paused_bundle_granting_secrets_is_previewed_then_approved(
    standing_system: inst.RukpakSystem, tmp_path: Path
) -> None:
    system = standing_system
    name = ns = f"preview-{SUFFIX}"
    role = ObjectRef("rbac.authorization.k8s.io", "v1", "ClusterRole", "", f"{ns}-secrets")
    refs = []
    for tag, exec_too in (("v1", False), ("v2", True)):
        root = secret_reader_bundle(tmp_path / tag, ns, exec_too=exec_too)
        refs.append(f"{system.registry_host}/lifecycle-{SUFFIX}/preview:{tag}")
        e2e.push_bundle(root, refs[-1])
    system.kube.create(bd_v2(name, refs[0], paused=True))
    shown = eventually(lambda: status(system, name).get("preview"), timeout=180, what="the preview")
    assert shown["objects"] == 4 and shown["clusterScoped"] == 3, shown
    assert any("secrets" in e for e in shown["escalations"]), shown
    assert system.kube.get(role) is None  # nothing applied
    text = rukpak(system, "preview", name)
    assert f"ClusterRole/{ns}-secrets" in text and "secrets" in text, text
    events = system.kubectl(
        "get", "events", "-n", "default", "--field-selector", f"involvedObject.name={name}"
    )
    assert "PreviewReady" in events

    # the tag moves after the preview: the approval installs what was reviewed, not v2
    e2e.push_bundle(tmp_path / "v2", refs[0])
    # approval (rukpak approve), only of the digest the preview is of
    pinned = str(status(system, name)["resolvedSource"]["image"]["ref"]).split("@")[1]
    wrong = "sha256:" + "0" * 64
    refused = subprocess.run(
        [str(Path(sys.executable).parent / "rukpak"), "approve", name, "--preview-digest",
         wrong, "--kubeconfig", str(system.kubeconfig)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert refused.returncode == 1 and f"the preview is of {pinned}, not {wrong}" in refused.stderr
    assert "approved" in rukpak(system, "approve", name, "--preview-digest", pinned)
    eventually(lambda: ready(system, name, 1), timeout=180, what="installed once approved")
    assert (system.kube.get(role) or {}).get("rules") == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["*"]}
    ]  # what the preview showed, not the content the tag moved to
    assert cond(system, name, "Approved")[:2] == ("True", "Approved")

    # a paused upgrade shows what approving it would add
    set_ref(system, name, refs[1], paused=True)

    def new_preview() -> Obj | None:
        found = status(system, name).get("preview") or {}
        return (
            found
            if found.get("generation") == live(system, name)["metadata"]["generation"]
            else None
        )

    eventually(new_preview, timeout=180, what="the upgrade's preview")
    changes = rukpak(system, "preview", name, "--diff")
    assert "+ " in changes and "pods/exec" in changes, changes
    assert "- " not in changes.replace("+ ", ""), changes  # nothing removed
    assert (system.kube.get(role) or {}).get("rules") == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["*"]}
    ]  # still what was approved
    approved = cond(system, name, "Approved")
    assert approved[:2] == ("False", "PreviewChanged"), approved
    assert approved[2].startswith(f"approved {pinned}, but the source now pins sha256:"), approved
    new_rules = status(system, name)["preview"]["newRules"]
    assert any("pods/exec" in r for r in new_rules), new_rules

    # unpaused under upgradePolicy ApproveEscalations: the upgrade adding exec waits for
    # an approval naming the new rule, then installs
    system.kube.merge_patch(
        actuate.bd_ref(name, model.API_VERSION_V2),
        {"spec": {"paused": False, "upgradePolicy": "ApproveEscalations"}},
    )

    def held() -> tuple[str, str, str] | None:
        found = cond(system, name, "Approved")
        return found if found[1] == "EscalationNeedsApproval" else None

    holding = eventually(held, timeout=180, what="the upgrade held for approval")
    assert "pods/exec" in holding[2], holding
    assert len((system.kube.get(role) or {}).get("rules") or []) == 1  # not installed
    upgrade = str(status(system, name)["resolvedSource"]["image"]["ref"]).split("@")[1]
    assert "approved" in rukpak(system, "approve", name, "--preview-digest", upgrade)
    eventually(lambda: ready(system, name, 2), timeout=180, what="the approved upgrade")
    assert len((system.kube.get(role) or {}).get("rules") or []) == 2
    delete(system, name)
