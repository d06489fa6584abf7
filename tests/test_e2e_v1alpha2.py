"""End to end: v1alpha2 BundleDeployments (content named inline, no Bundles) on the local
kubelet, beside v1alpha1 ones, from the manifests users apply.

RukPak is installed from ``deploy/`` as users install it (``standing_system``): the
manager serves the conversion webhook and plans each object in the version it was created
in; the standing provisioner takes every run and no pod is started for any change
(checked after each test). Checked here:

- a v1alpha2 BundleDeployment with an image tag is pinned by digest, installed by an
  instance run the standing provisioner takes, reading the pinned image from the store
  volume (Unpacked, HasValidBundle, Installed,
  Healthy in upstream's words), has no Bundle objects, reads as v1alpha1 through the
  manager's conversion, and deleting it removes what it installed;
- ``requireImmutableRefs`` refuses a tag before anything is fetched;
- ``pollInterval`` moves a BundleDeployment to what its tag names now, while one without
  it stays on its pin;
- ``paused`` applies nothing (it previews) while a BundleDeployment created after it
  installs.
"""

from __future__ import annotations

import base64
import functools
import io
import json
import ssl
import tarfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
import yaml

from provisioner.engine.objects import ObjectRef
from provisioner.manager import model
from provisioner.manager.acting import actuate
from tests import bundles, csi_helpers
from tests import e2e_helpers as e2e
from tests import install_helpers as inst
from tests.polling import eventually
from tests.registry import RegistryServer

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SUFFIX = uuid.uuid4().hex[:6]
bd_v2, live, cond, greeting = inst.bd_v2, inst.live_v2, inst.cond_v2, inst.greeting


def installed(system: inst.RukpakSystem, name: str) -> str:
    """The revision installed ("" until Installed)."""
    status, reason, message = cond(system, name, "Installed")
    if (status, reason) != ("True", "InstallationSucceeded"):
        return ""
    prefix, suffix = "Instantiated bundle ", " successfully"
    assert message.startswith(prefix) and message.endswith(suffix), message
    return message[len(prefix) : -len(suffix)]


def pinned(system: inst.RukpakSystem, name: str) -> str:
    resolved = (live(system, name).get("status") or {}).get("resolvedSource") or {}
    return str((resolved.get("image") or {}).get("ref") or "")


def push(system: inst.RukpakSystem, root: Path, repo: str, tag: str = "v1") -> str:
    """Push the bundle at ``root`` as ``<registry>/e2e-v2-<suffix>/<repo>:<tag>``; its ref."""
    ref = f"{system.registry_host}/e2e-v2-{SUFFIX}/{repo}:{tag}"
    e2e.push_bundle(root, ref)
    return ref


def push_hello(
    system: inst.RukpakSystem, root: Path, repo: str, tag: str, ns: str, text: str
) -> str:
    inst.hello_bundle(root, namespace=ns, image=system.busybox_image, greeting=text)
    return push(system, root, repo, tag)


def install_hello(
    system: inst.RukpakSystem, root: Path, prefix: str, text: str
) -> tuple[str, str, str]:
    """The hello bundle greeting ``text``, pushed as ``<prefix>:v1`` and installed into
    the namespace ``<prefix>-<suffix>`` by the v1alpha2 BundleDeployment of that name:
    (the name, the ref, the installed revision) once Installed."""
    name = ns = f"{prefix}-{SUFFIX}"
    ref = push_hello(system, root, prefix, "v1", ns, text)
    system.kube.create(bd_v2(name, ref))
    revision = eventually(lambda: installed(system, name), timeout=180, what="Installed")
    return name, ref, revision


def test_a_v1alpha2_bundledeployment_installs_without_bundles_and_uninstalls(
    standing_system: inst.RukpakSystem, tmp_path: Path
) -> None:
    system = standing_system
    name, ref, revision = install_hello(system, tmp_path / "b", "inline", "inline")
    ns = name
    assert revision.startswith(f"{name}-")
    assert cond(system, name, "Unpacked")[:2] == ("True", "UnpackSuccessful")
    assert cond(system, name, "HasValidBundle")[0] == "True"
    assert pinned(system, name).startswith(ref.rsplit(":", 1)[0] + "@sha256:")
    eventually(lambda: cond(system, name, "Healthy")[0] == "True", timeout=120, what="Healthy")
    assert greeting(system, ns) == "inline"
    bundles = system.kubectl("get", "bundles", "-l", f"{model.BD_LABEL}={name}", "-o", "name")
    assert bundles.strip() == ""  # created as v1alpha2: no Bundle objects
    # through the manager's conversion, a v1alpha1 client sees a template of the same source
    as_v1 = json.loads(
        system.kubectl("get", f"bundledeployments.v1alpha1.{model.GROUP}", name, "-o", "json")
    )
    assert as_v1["spec"]["template"]["spec"]["source"]["image"]["ref"] == ref
    table = system.kubectl("get", "bundledeployments", name)
    assert "InstallationSucceeded" in table and "INSTALL STATE" in table
    inst.delete_v2(system, name)
    inst.gone(system, inst.greeting_ref(ns))


def test_require_immutable_refs_refuses_a_tag_before_fetching(
    standing_system: inst.RukpakSystem,
) -> None:
    system = standing_system
    name = f"immutable-{SUFFIX}"
    ref = f"{system.registry_host}/e2e-v2-{SUFFIX}/never:v1"
    system.kube.create(bd_v2(name, ref, requireImmutableRefs=True))
    status, reason, message = eventually(
        lambda: c if (c := cond(system, name, "Unpacked"))[0] != "None" else None,
        timeout=60,
        what="Unpacked",
    )
    assert (status, reason) == ("False", "UnpackFailed")
    assert message.startswith("source bundle content: spec.requireImmutableRefs is set: ")
    assert f'"{ref}" is a tag' in message
    assert pinned(system, name) == ""
    inst.delete_v2(system, name, timeout=120)


def test_broken_v1alpha2_bundles_fail_in_upstream_v0_24s_words(
    standing_system: inst.RukpakSystem,
) -> None:
    """Upstream v0.24's suite: a tag that does not exist is an ``Unpacked`` condition naming
    the image descriptor; a bundle without ``manifests/``, an empty one and one with a
    subdirectory are Installed=False InstallFailed in the plain provisioner's words."""
    system = standing_system
    host, repo = system.registry_host, f"e2e-v2-{SUFFIX}"
    images: dict[str, list[csi_helpers.Entry]] = {
        "no-manifests": [("README", "file", "no manifests here")],
        "empty": [("manifests", "dir")],
        "subdir": [
            ("manifests", "dir"),
            ("manifests/emptydir", "dir"),
            ("manifests/namespace-a.yaml", "file", yaml.safe_dump(bundles.namespace("a"))),
        ],
    }
    refs = {
        tag: csi_helpers.push_image(host, repo, tag, [entries]).ref
        for tag, entries in images.items()
    }
    refs["missing"] = f"{host}/{repo}/plain-v0:non-existent-tag"
    names = {tag: f"words-{tag}-{SUFFIX}" for tag in refs}
    for tag, ref in refs.items():
        system.kube.create(bd_v2(names[tag], ref))
    _, _, message = eventually(
        lambda: (
            c if "error fetching" in (c := cond(system, names["missing"], "Unpacked"))[2] else None
        ),
        timeout=60,
        what="Unpacked naming the image descriptor",
    )
    assert "source bundle content: error fetching image descriptor" in message
    expected = {
        "no-manifests": "readdir manifests: file does not exist",
        "empty": "found zero objects: plain+v0 bundles are required to contain at least one object",
        "subdir": 'subdirectories are not allowed within the "manifests" directory of the bundle '
        'image filesystem: found "manifests/emptydir"',
    }

    def failed(tag: str) -> tuple[str, str, str] | None:
        c = cond(system, names[tag], "Installed")
        return c if c[1] == "InstallFailed" else None

    for tag, words in expected.items():
        status, _, message = eventually(
            functools.partial(failed, tag),
            timeout=180,
            what=f"{tag}: InstallFailed",
        )
        assert status == "False" and words in message, (tag, message)
        assert cond(system, names[tag], "Healthy")[:2] == ("False", "InstallationStatusFalse")
    for name in names.values():
        inst.delete_v2(system, name, timeout=120)


def test_poll_interval_follows_a_tag_and_without_it_the_pin_holds(
    standing_system: inst.RukpakSystem, tmp_path: Path
) -> None:
    system = standing_system
    polled, fixed = f"polled-{SUFFIX}", f"fixed-{SUFFIX}"
    ns_polled, ns_fixed = f"polled-{SUFFIX}", f"fixed-{SUFFIX}"
    ref_polled = push_hello(system, tmp_path / "p1", "polled", "live", ns_polled, "one")
    ref_fixed = push_hello(system, tmp_path / "f1", "fixed", "live", ns_fixed, "one")
    system.kube.create(bd_v2(polled, ref_polled, pollInterval="3s"))
    system.kube.create(bd_v2(fixed, ref_fixed))
    for name in (polled, fixed):
        eventually(
            functools.partial(installed, system, name), timeout=180, what=f"{name} Installed"
        )
    first_polled, first_fixed = pinned(system, polled), pinned(system, fixed)
    push_hello(system, tmp_path / "p2", "polled", "live", ns_polled, "two")
    push_hello(system, tmp_path / "f2", "fixed", "live", ns_fixed, "two")
    eventually(lambda: greeting(system, ns_polled) == "two", timeout=180, what="the polled pivot")
    assert pinned(system, polled) != first_polled
    # the polled one re-resolved at least once since the push; the other kept its pin
    assert pinned(system, fixed) == first_fixed
    assert greeting(system, ns_fixed) == "one"
    inst.delete_v2(system, polled, fixed)


def test_a_paused_bundledeployment_applies_nothing_and_previews(
    standing_system: inst.RukpakSystem, tmp_path: Path
) -> None:
    system = standing_system
    paused, after = f"paused-{SUFFIX}", f"after-{SUFFIX}"
    ns = f"paused-{SUFFIX}"
    ref = push_hello(system, tmp_path / "b", "paused", "v1", ns, "p")
    system.kube.create(bd_v2(paused, ref, paused=True))
    system.kube.create(bd_v2(after, ref))
    eventually(lambda: installed(system, after), timeout=180, what="the later one Installed")
    shown = eventually(
        lambda: (live(system, paused).get("status") or {}).get("preview"),
        timeout=120,
        what="the preview",
    )
    assert shown["objects"] == 3 and not shown.get("error"), shown
    assert installed(system, paused) == ""
    # nothing of it was applied: the preview's objects are the later one's, owned by it
    cm = system.kube.get(inst.greeting_ref(ns)) or {}
    assert cm["metadata"]["labels"]["core.rukpak.io/owner-name"] == after
    inst.delete_v2(system, paused, after)


def push_split_hello(system: inst.RukpakSystem, root: Path, ns: str, repo: str) -> dict[str, str]:
    """hello as two plain bundles, ``app`` (its Namespace and Deployment) and ``config``
    (its ConfigMap), pushed as ``<repo>-app`` and ``<repo>-config``; their refs by part."""
    whole = inst.hello_bundle(root / "whole", namespace=ns, image=system.busybox_image)
    app, config = root / "app", root / "config"
    for part in (app, config):
        (part / "manifests").mkdir(parents=True)
    for path in sorted((whole / "manifests").iterdir()):
        part = config if "configmap" in path.name else app
        (part / "manifests" / path.name).write_text(path.read_text())
    return {part.name: push(system, part, f"{repo}-{part.name}") for part in (app, config)}


def create_of_sources(system: inst.RukpakSystem, name: str, sources: dict[str, str]) -> None:
    """Create the v1alpha2 BundleDeployment ``name`` of several image sources, each
    mounted at its destination (``sources``: destination -> ref)."""
    doc = bd_v2(
        name,
        "",
        sources=[
            {"type": "image", "image": {"ref": ref}, "destination": destination}
            for destination, ref in sources.items()
        ],
    )
    del doc["spec"]["source"]
    system.kube.create(doc)


def test_several_sources_each_mount_at_their_destination_and_install_together(
    standing_system: inst.RukpakSystem, tmp_path: Path
) -> None:
    system = standing_system
    name = ns = f"multi-{SUFFIX}"
    create_of_sources(system, name, push_split_hello(system, tmp_path, ns, "multi"))
    eventually(lambda: installed(system, name), timeout=180, what="Installed")
    assert greeting(system, ns) == "Hello from a RukPak bundle"
    deployment = ObjectRef("apps", "v1", "Deployment", ns, "hello")
    assert system.kube.get(deployment) is not None
    resolved = (live(system, name).get("status") or {}).get("resolvedSources") or []
    assert [r["destination"] for r in resolved] == ["app", "config"]
    assert all("@sha256:" in r["image"]["ref"] for r in resolved)
    inst.delete_v2(system, name)
    inst.gone(system, deployment)


def test_two_sources_with_the_same_object_fail_naming_both(
    standing_system: inst.RukpakSystem, tmp_path: Path
) -> None:
    system = standing_system
    name = ns = f"clash-{SUFFIX}"
    config = push_split_hello(system, tmp_path, ns, "clash")["config"]
    create_of_sources(system, name, {"one": config, "two": config})
    status, _, message = eventually(
        lambda: c if (c := cond(system, name, "Installed"))[1] == "InstallFailed" else None,
        timeout=180,
        what="InstallFailed",
    )
    assert status == "False" and "two sources hold the same object" in message
    assert "one/manifests/" in message and "two/manifests/" in message
    inst.delete_v2(system, name)


def fetch(url: str, ca: bytes, token: str) -> tuple[int, bytes]:
    context = ssl.create_default_context(cadata=ca.decode())
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, context=context, timeout=60) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def webhook_ca(system: inst.RukpakSystem) -> bytes:
    """The CA of the manager's HTTPS server (its Secret)."""
    secret = system.kube.get(ObjectRef("", "v1", "Secret", inst.NAMESPACE, "rukpak-webhook-cert"))
    assert secret is not None
    return base64.b64decode(secret["data"]["ca.crt"])


def tokens_of(system: inst.RukpakSystem, namespace: str, role: str, binding: str) -> dict[str, str]:
    """Tokens of two new ServiceAccounts in ``namespace``: ``allowed`` bound to the
    ClusterRole ``role`` (by ``binding``), ``stranger`` bound to nothing."""
    system.kubectl("create", "namespace", namespace)
    for account in ("allowed", "stranger"):
        system.kubectl("create", "serviceaccount", account, "-n", namespace)
    system.kubectl(
        "create", "clusterrolebinding", binding,
        f"--clusterrole={role}", f"--serviceaccount={namespace}:allowed",
    )  # fmt: skip
    return {
        account: system.kubectl("create", "token", account, "-n", namespace).strip()
        for account in ("allowed", "stranger")
    }


def test_content_url_serves_the_bundle_to_a_bundle_reader_only(
    standing_system: inst.RukpakSystem, tmp_path: Path
) -> None:
    system = standing_system
    name, ref, _ = install_hello(system, tmp_path / "b", "content", "content")
    url = str((live(system, name).get("status") or {}).get("contentURL") or "")
    assert url == f"https://127.0.0.1:9443/bundles/{name}.tgz"
    ca = webhook_ca(system)
    tokens = tokens_of(system, f"readers-{SUFFIX}", "bundle-reader", f"bundle-reader-{SUFFIX}")
    status, body = fetch(url, ca, tokens["allowed"])
    assert status == 200, body[:300]
    with tarfile.open(fileobj=io.BytesIO(body), mode="r:gz") as tar:
        names = tar.getnames()
        greeting_file = tar.extractfile("manifests/02_configmap.yaml")
        assert greeting_file is not None and b"content" in greeting_file.read()
    assert "manifests/01_namespace.yaml" in names
    assert fetch(url, ca, tokens["stranger"])[0] == 403
    assert fetch(url, ca, "")[0] == 401
    assert fetch(url, ca, "not-a-token")[0] == 401
    missing = url.replace(name, f"nothing-{SUFFIX}")
    assert fetch(missing, ca, tokens["allowed"])[0] == 404
    # a v1alpha1 Bundle gets one too, once Unpacked
    bundle = f"content-bundle-{SUFFIX}"
    system.kube.create(bundles.bundle_doc(bundle, ref))
    bundle_url = eventually(
        lambda: (
            (system.kube.get(actuate.bundle_ref(bundle)) or {}).get("status", {}).get("contentURL")
        ),
        timeout=180,
        what="the Bundle's contentURL",
    )
    assert fetch(str(bundle_url), ca, tokens["allowed"])[0] == 200
    system.kubectl("delete", "bundle", bundle, "--wait=false")
    system.kubectl("delete", "clusterrolebinding", f"bundle-reader-{SUFFIX}")
    inst.delete_v2(system, name)


def test_the_manager_exports_controller_runtime_metrics_to_an_authorized_scraper(
    standing_system: inst.RukpakSystem, tmp_path: Path
) -> None:
    """Both replicas answer on the node's port 9443; the leader's figures move with work."""
    system = standing_system
    ca = webhook_ca(system)
    tokens = tokens_of(system, f"scrapers-{SUFFIX}", "rukpak-metrics-reader", f"metrics-{SUFFIX}")
    token = tokens["allowed"]
    url = "https://127.0.0.1:9443/metrics"
    assert fetch(url, ca, "")[0] == 401
    assert fetch(url, ca, tokens["stranger"])[0] == 403

    def leader_text() -> str | None:
        status, body = fetch(url, ca, token)
        assert status == 200, body[:300]
        text = body.decode()
        return text if 'leader_election_master_status{name="rukpak-manager"} 1.0' in text else None

    before = eventually(leader_text, timeout=60, interval=0.2, what="a scrape of the leader")
    for name, kind in (
        ("controller_runtime_reconcile_total", "counter"),
        ("controller_runtime_reconcile_errors_total", "counter"),
        ("controller_runtime_reconcile_time_seconds", "histogram"),
        ("controller_runtime_max_concurrent_reconciles", "gauge"),
        ("workqueue_depth", "gauge"),
        ("workqueue_adds_total", "counter"),
        ("workqueue_queue_duration_seconds", "histogram"),
        ("workqueue_work_duration_seconds", "histogram"),
        ("workqueue_retries_total", "counter"),
        ("rest_client_requests_total", "counter"),
        ("rukpak_bundledeployments", "gauge"),
        ("rukpak_install_duration_seconds", "histogram"),
        ("rukpak_rollbacks_total", "counter"),
        ("rukpak_revisions", "gauge"),
        ("rukpak_bundledeployments_rolled_back", "gauge"),
        ("rukpak_bundledeployment_status_condition", "gauge"),
        ("rukpak_bundledeployment_rolled_back", "gauge"),
        ("rukpak_webhook_certificate_expiry_timestamp_seconds", "gauge"),
        ("controller_runtime_webhook_requests_total", "counter"),
        ("rukpak_webhook_verdicts_total", "counter"),
        ("process_resident_memory_bytes", "gauge"),
    ):
        assert f"# TYPE {name} {kind}\n" in before, name
    assert 'workqueue_depth{name="rukpak-manager"}' in before
    workers = next(
        (
            float(a.split("=", 1)[1])
            for d in system.documents()
            if (d["kind"], d["metadata"]["name"]) == ("Deployment", inst.MANAGER)
            for a in d["spec"]["template"]["spec"]["containers"][0].get("args") or []
            if a.startswith("--workers=")
        ),
        2.0,  # the manager's default
    )
    assert (
        f'controller_runtime_max_concurrent_reconciles{{controller="bundle"}} {workers}' in before
    )
    assert 'rest_client_requests_total{code="200",host=' in before

    def sample(text: str, prefix: str) -> float:
        for line in text.splitlines():
            if line.startswith(prefix):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def successes(text: str) -> float:
        return sample(
            text,
            'controller_runtime_reconcile_total{controller="bundledeployment",result="success"}',
        )

    def installs(text: str) -> float:
        return sample(text, 'rukpak_install_duration_seconds_count{kind="install"}')

    name, _, _ = install_hello(system, tmp_path / "b", "metrics", "m")
    after = eventually(
        lambda: (
            t
            if (t := leader_text())
            and successes(t) > successes(before)
            and installs(t) > installs(before)
            else None
        ),
        timeout=60,
        interval=0.2,
        what="more successful reconciles and one more install counted by the leader",
    )
    assert 'rukpak_bundledeployments{condition="Installed",status="True"}' in after
    assert 'rukpak_revisions{outcome="Installed"}' in after
    # the total counts every rolled-back BundleDeployment on the shared cluster: it must
    # agree with the per-BundleDeployment series
    rolled_back = [
        line
        for line in after.splitlines()
        if line.startswith("rukpak_bundledeployment_rolled_back{") and line.endswith(" 1.0")
    ]
    assert sample(after, "rukpak_bundledeployments_rolled_back ") == len(rolled_back), rolled_back
    # per BundleDeployment: one series per condition, named, with the reason
    assert (
        f'rukpak_bundledeployment_status_condition{{bundledeployment="{name}",'
        'condition="Installed",reason="InstallationSucceeded",status="True"} 1.0'
    ) in after
    assert f'rukpak_bundledeployment_rolled_back{{bundledeployment="{name}"}} 0.0' in after
    # the serving certificate ends about a year from now (the manager made it at start)
    left = sample(
        after, 'rukpak_webhook_certificate_expiry_timestamp_seconds{certificate="serving"}'
    )
    assert 300 * 86400 < left - time.time() < 366 * 86400
    inst.delete_v2(system, name)
    # the deleted BundleDeployment's series leave with it
    eventually(
        lambda: (t := leader_text()) and f'bundledeployment="{name}"' not in t,
        timeout=60,
        interval=0.2,
        what="the deleted BundleDeployment's series gone from the scrape",
    )
    system.kubectl("delete", "clusterrolebinding", f"metrics-{SUFFIX}")


def test_a_private_image_installs_with_the_pull_secret_its_source_names(
    standing_system: inst.RukpakSystem, tmp_path: Path
) -> None:
    """``spec.source.image.pullSecret`` (upstream's field): the manager pins the tag with
    the Secret's login, and the instance's volume presents it to the node plugin; without
    it the registry's refusal is the condition's message."""
    system = standing_system
    name = ns = f"private-{SUFFIX}"
    registry = RegistryServer.start(tmp_path / "registry", auth="htpasswd")
    secret_name = f"pull-{SUFFIX}"
    try:
        docs = [bundles.namespace(ns), bundles.configmap("greeting", ns, greeting="private")]
        text = yaml.safe_dump_all(docs).encode()
        manifests: list[csi_helpers.Entry] = [
            ("manifests/", "dir"),
            ("manifests/cm.yaml", "file", text),
        ]
        data, pushed = csi_helpers.private_image(registry, f"private-{SUFFIX}", manifests)
        system.kube.create(inst.bd_v2(name, pushed.ref, installNamespace=ns))
        refused = eventually(
            lambda: (
                c if registry.host in (c := inst.cond_v2(system, name, "Unpacked"))[2] else None
            ),
            timeout=120,
            what="the source refused without credentials",
        )
        assert refused[0] == "False" and "pull secret" in refused[2], refused
        system.kube.create(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": secret_name, "namespace": inst.NAMESPACE},
                "type": "kubernetes.io/dockerconfigjson",
                "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()},
            }
        )
        source = {"type": "image", "image": {"ref": pushed.ref, "pullSecret": secret_name}}
        inst.set_source_v2(system, name, source)
        inst.installed_v2(system, name, what="installed with the pull secret")
        cm = system.kube.get(ObjectRef("", "v1", "ConfigMap", ns, "greeting")) or {}
        assert cm.get("data") == {"greeting": "private"}
        resolved = inst.live_v2(system, name)["status"]["resolvedSource"]["image"]
        assert resolved["pullSecret"] == secret_name and "@sha256:" in resolved["ref"]
        assert registry.password is not None
        logs = system.kubectl(
            "logs", "-n", inst.NAMESPACE, "deployment/rukpak-manager", "--tail=400"
        )
        assert registry.password not in logs
    finally:
        inst.delete_v2(system, name)
        system.kube.delete(ObjectRef("", "v1", "Secret", inst.NAMESPACE, secret_name))
        registry.stop()
