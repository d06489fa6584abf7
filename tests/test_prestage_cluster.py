"""Pre-staged pivots against a real kube-apiserver and a real registry: the manager's gate
(``provisioner.manager.acting.prestage``) holds a v1alpha2 BundleDeployment's pin until the node
plugin's watch (``csi.node.prestagewatch``) has fetched the new digest into its node's
image cache and said so on its Node; a node that never answers holds it only until the
timeout.

The manager follows the answering Nodes with an informer (``watching.nodewatch``): a Node's
answer wakes the held pivot at once, and deciding sends no request. The manager's client
counts its Node requests by thread (``CountingKube``) to prove it: with no following Node a
pivot makes none, and a held pivot makes none while it waits (no polling).

The manager's controller and the plugin's watch run in-process (a real image cache under
tmp_path); no kubelet runs here, so the Nodes are API objects the test creates. The same
flow on three real nodes from deploy/ is ``test_multinode_prestage``.
"""

from __future__ import annotations

import builtins
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from csi.node.prestage import Prestager
from csi.node.prestagewatch import PrestageMetrics, PrestageWatch
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef
from provisioner.manager import controller, model
from provisioner.manager.acting import actuate, prestage
from rukpak.common import prestage as words
from rukpak.common.metrics import OwnRegistry
from rukpak.image.cache import ImageCache
from rukpak.image.cachestate import Holder
from rukpak.image.seams import PullPolicy
from rukpak.oci import client as oci_client
from rukpak.oci.manifest import Platform
from rukpak.oci.reference import Reference
from tests import e2e_helpers as e2e
from tests import manager_harness
from tests.bundles import configmap, namespace, write_bundle
from tests.crd_helpers import install_crds
from tests.install_helpers import bd_v2
from tests.polling import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.registry]

SUFFIX = uuid.uuid4().hex[:6]
SYSTEM_NS = f"rukpak-prestage-{SUFFIX}"
NODE = f"prestage-node-{SUFFIX}"
SILENT_NODE = f"prestage-silent-{SUFFIX}"
PLATFORM = Platform("linux", "amd64")
TIMEOUT = 8.0


def push(root: Path, ref: str, greeting: str, *, padding: int = 0) -> str:
    """Push a bundle of one ConfigMap saying ``greeting`` (and ``padding`` bytes of data
    beside the manifests) as ``ref``; its pinned reference."""
    write_bundle(
        root,
        {"app.yaml": [namespace("prestage"), configmap("hello", "prestage", greeting=greeting)]},
    )
    if padding:
        (root / "data.bin").write_bytes(os.urandom(padding))
    e2e.push_bundle(root, ref)
    digest = oci_client.RegistryClient(retries=0).resolve(Reference.parse(ref)).digest
    return f"{ref.rsplit(':', 1)[0]}@{digest}"


ANSWERING_NODE = f"prestage-answering-{SUFFIX}"


class CountingKube(Kube):
    """The manager's client, counting its reads of Nodes by the thread that sent them (the
    Node informer's are ``informer-Node``; any other is the pivot path)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.node_reads: builtins.list[str] = []

    def list(
        self, api_version: str, kind: str, *, namespace: str = "", label_selector: str = ""
    ) -> tuple[list[Obj], str]:
        if kind == "Node":
            self.node_reads.append(threading.current_thread().name)
        return super().list(api_version, kind, namespace=namespace, label_selector=label_selector)

    def get(self, ref: ObjectRef) -> Obj | None:
        if ref.kind == "Node":
            self.node_reads.append(threading.current_thread().name)
        return super().get(ref)

    def pivot_reads(self) -> builtins.list[str]:
        """Node reads not made by the Node informer."""
        return [t for t in self.node_reads if t != "informer-Node"]


@pytest.fixture(scope="module")
def manager_kube(kube_apiserver: Any) -> Iterator[CountingKube]:
    counting = CountingKube.from_kubeconfig(str(kube_apiserver.kubeconfig))
    assert isinstance(counting, CountingKube)
    yield counting
    counting.close()


@pytest.fixture(scope="module")
def manager(kube: Kube, manager_kube: CountingKube) -> Iterator[controller.Controller]:
    install_crds(kube)
    manager_harness.prepare_system_namespace(kube, SYSTEM_NS)
    settings = model.Settings(
        image="registry.example/rukpak:test", system_namespace=SYSTEM_NS, host_network=True
    )
    ctl = controller.Controller(
        manager_kube,
        settings,
        resolve=actuate.RegistryResolver(oci_client.RegistryClient(retries=0)),
        resync=3600.0,  # no periodic look: a held pivot goes on by a wake or its timer
        watch_timeout=10,
        prestage_gate=prestage.Gate(timeout=TIMEOUT),
    )
    ctl.start()
    assert ctl.nodes is not None and ctl.nodes.informer.wait_synced(30)
    yield ctl
    ctl.stop()


def pivot_reads(manager: controller.Controller) -> list[str]:
    """The manager's Node reads not made by its Node informer (its client is ``manager_kube``)."""
    assert isinstance(manager.kube, CountingKube)
    return manager.kube.pivot_reads()


@pytest.fixture(scope="module")
def images(tmp_path_factory: pytest.TempPathFactory) -> ImageCache:
    return ImageCache(
        tmp_path_factory.mktemp("prestage") / "images",
        puller_factory=lambda creds: oci_client.RegistryClient(credentials=creds, retries=0),
        durable=False,
    )


@pytest.fixture(scope="module")
def plugin(
    kube: Kube, kube_apiserver: Any, images: ImageCache
) -> Iterator[tuple[PrestageWatch, OwnRegistry]]:
    """The node plugin's watch for Node NODE (which the test creates)."""
    registry = OwnRegistry()
    watch = follow(kube, kube_apiserver, images, NODE, metrics=PrestageMetrics(registry))
    yield watch, registry
    watch.stop()
    kube.delete(ObjectRef("", "v1", "Node", "", NODE))


def follow(
    kube: Kube, kube_apiserver: Any, images: ImageCache, node: str, **options: Any
) -> PrestageWatch:
    """A node plugin's pre-stage watch for Node ``node`` (made here), started and waited
    for until it labelled its Node."""
    kube.apply({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    cfg = client.Configuration()
    config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=str(kube_apiserver.kubeconfig), client_configuration=cfg
    )
    stager = Prestager(
        images=images,
        puller_factory=lambda creds: oci_client.RegistryClient(credentials=creds, retries=0),
        platform=PLATFORM,
        interval=0.1,
    )
    watch = PrestageWatch(
        client.ApiClient(cfg), node=node, prestager=stager, advertise_max=3, **options
    ).start()
    eventually(
        lambda: labels(kube, node).get(words.ENABLED_LABEL) == "true",
        timeout=20,
        what="the plugin's label",
    )
    return watch


def labels(kube: Kube, node: str) -> dict[str, str]:
    obj = kube.get(ObjectRef("", "v1", "Node", "", node)) or {}
    return dict((obj.get("metadata") or {}).get("labels") or {})


def answers(kube: Kube, node: str) -> dict[str, words.Answer]:
    obj = kube.get(ObjectRef("", "v1", "Node", "", node)) or {}
    return words.parse_states(
        ((obj.get("metadata") or {}).get("annotations") or {}).get(words.STATE_ANNOTATION)
    )


def live(kube: Kube, name: str) -> Obj:
    return kube.get(actuate.bd_ref(name, model.API_VERSION_V2)) or {}


def pinned_ref(bd: Obj) -> str:
    return str(
        (((bd.get("status") or {}).get("resolvedSource") or {}).get("image") or {}).get("ref") or ""
    )


def reasons(kube: Kube, name: str) -> list[tuple[str, str]]:
    items, _ = kube.list("v1", "Event", namespace="default")
    return [
        (str(e.get("reason")), str(e.get("message")))
        for e in sorted(items, key=lambda e: str(e.get("firstTimestamp") or ""))
        if (e.get("involvedObject") or {}).get("name") == name
    ]


def said_prestaged(kube: Kube, name: str) -> list[tuple[str, str]] | None:
    said = reasons(kube, name)
    return said if sum(r == "Prestaged" for r, _ in said) >= 2 else None  # one, then two


def test_with_no_node_following_asks_a_pivot_goes_on_without_a_node_request(
    kube: Kube, manager: controller.Controller, registry: Any, tmp_path: Path
) -> None:
    """(Runs before the plugin fixture labels its Node.)"""
    assert manager.nodes is not None
    following = [o["metadata"]["name"] for o in manager.nodes.informer.items()]
    assert following == [], f"Nodes left labelled {words.ENABLED_LABEL} by other tests"
    before = len(pivot_reads(manager))
    name = f"prestage-none-{SUFFIX}"
    one = push(tmp_path / "one", f"{registry.host}/prestage/none-{SUFFIX}:v1", "none")
    kube.apply(bd_v2(name, one))
    bd = eventually(
        lambda: b if pinned_ref(b := live(kube, name)) == one else None,
        timeout=30,
        what="the pin",
    )
    assert words.REQUEST_ANNOTATION not in (bd["metadata"].get("annotations") or {})
    assert pivot_reads(manager)[before:] == []  # the gate read its cache only
    assert not any(r.startswith("Prestag") for r, _ in reasons(kube, name))


def test_a_held_pivot_goes_on_as_soon_as_a_node_writes_its_answer(
    kube: Kube, manager: controller.Controller, registry: Any, tmp_path: Path
) -> None:
    """A Node with no plugin: the test writes its answer. The BD's own timeout (10 minutes)
    is far longer than the test waits: only the answer's watch event can release it."""
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": ANSWERING_NODE, "labels": {words.ENABLED_LABEL: "true"}},
        }
    )
    try:
        assert manager.nodes is not None
        manager.nodes.informer.wait(
            lambda: (
                manager.nodes is not None
                and manager.nodes.informer.get("", ANSWERING_NODE) is not None
            ),
            timeout=20,
        )
        one = push(tmp_path / "one", f"{registry.host}/prestage/held-{SUFFIX}:v1", "held")
        digest = one.rsplit("@", 1)[1]
        name = f"prestage-held-{SUFFIX}"
        body = bd_v2(name, one)
        body["metadata"]["annotations"] = {words.TIMEOUT_ANNOTATION: "600"}
        kube.apply(body)
        at = eventually(
            lambda: words.asked_at(
                (live(kube, name)["metadata"].get("annotations") or {}).get(
                    words.REQUEST_ANNOTATION
                )
            ),
            timeout=30,
            what="the ask",
        )
        # held: it waits for this Node (its gate remembers it) and is not pinned
        gate = manager.prestage_gate
        assert gate is not None
        eventually(lambda: name in gate.held(), timeout=10, what="the pivot held")
        assert pinned_ref(live(kube, name)) == ""
        held_reads = len(pivot_reads(manager))
        answer = words.Answer(state=words.CACHED, bytes=1, total=1, at=1.0, asked=at)
        notes = {words.STATE_ANNOTATION: words.dump_states({digest: answer})}
        kube.merge_patch(
            ObjectRef("", "v1", "Node", "", ANSWERING_NODE),
            {"metadata": {"annotations": notes}},
        )
        eventually(
            lambda: pinned_ref(live(kube, name)) == one, timeout=30, what="the pin on the answer"
        )
        assert pivot_reads(manager)[held_reads:] == []  # woken, not polling
        said = eventually(
            lambda: [m for r, m in reasons(kube, name) if r == "Prestaged"] or None,
            timeout=10,
            what="Prestaged",
        )
        assert f"cached on {ANSWERING_NODE}" in said[0]
        assert not any(r == "PrestageTimedOut" for r, _ in reasons(kube, name))
        assert name not in gate.held()
    finally:
        kube.delete(ObjectRef("", "v1", "Node", "", ANSWERING_NODE))


def test_a_pivot_waits_until_the_node_that_holds_the_bundle_has_fetched_the_new_digest(
    kube: Kube,
    manager: controller.Controller,
    plugin: tuple[PrestageWatch, OwnRegistry],
    images: ImageCache,
    registry: Any,
    tmp_path: Path,
) -> None:
    tag = f"{registry.host}/prestage/app-{SUFFIX}:live"
    one = push(tmp_path / "one", tag, "one")
    images.ensure(  # a pod on this node mounts revision one (what a publish leaves)
        one,
        platform=PLATFORM,
        pull_policy=PullPolicy.IF_NOT_PRESENT,
        holder=Holder(target="/var/lib/kubelet/pods/x/volumes/b", volume_id="b", image=tag),
    )
    name = f"prestage-{SUFFIX}"
    kube.apply(bd_v2(name, one))
    eventually(lambda: pinned_ref(live(kube, name)) == one, timeout=30, what="revision one pinned")

    two = push(tmp_path / "two", tag, "two", padding=4 * 2**20)
    digest = two.rsplit("@", 1)[1]
    assert not images.has_tree(digest)
    kube.merge_patch(
        actuate.bd_ref(name, model.API_VERSION_V2), {"spec": {"source": {"image": {"ref": two}}}}
    )
    bd = eventually(
        lambda: b if pinned_ref(b := live(kube, name)) == two else None,
        timeout=30,
        what="revision two pinned",
    )
    # by the time the pin was written, the node had the content and had said so
    assert images.has_tree(digest)
    answer = answers(kube, NODE)[digest]
    assert answer.state == words.CACHED and answer.bytes == answer.total > 4 * 2**20
    ask = words.parse_request(
        (bd["metadata"].get("annotations") or {}).get(words.REQUEST_ANNOTATION)
    )
    assert ask == [two]
    assert labels(kube, NODE).get(words.cached_label(digest)) == "true"
    said = eventually(lambda: said_prestaged(kube, name), timeout=10, what="Prestaged")
    assert any(r == "Prestaging" and two in m for r, m in said)
    assert any(r == "Prestaged" and two in m and f"cached on {NODE}" in m for r, m in said)
    assert any(r == "PrestageProgress" and "cached" in m and "100%" in m for r, m in said)
    _, registry_metrics = plugin
    total = registry_metrics.registry.get_sample_value(
        "rukpak_csi_prestage_total_bytes", {"digest": digest}
    )
    assert total == answer.total


def test_a_node_that_never_answers_holds_the_pivot_only_until_the_timeout(
    kube: Kube,
    manager: controller.Controller,
    plugin: tuple[PrestageWatch, OwnRegistry],
    registry: Any,
    tmp_path: Path,
) -> None:
    node = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": SILENT_NODE, "labels": {words.ENABLED_LABEL: "true"}},
    }
    kube.apply(node)
    try:
        tag = f"{registry.host}/prestage/silent-{SUFFIX}:v1"
        one = push(tmp_path / "one", tag, "silent")
        name = f"prestage-silent-{SUFFIX}"
        kube.apply(bd_v2(name, one))
        bd = eventually(
            lambda: b if pinned_ref(b := live(kube, name)) == one else None,
            timeout=TIMEOUT + 30,
            what="the pin after the timeout",
        )
        at = words.asked_at((bd["metadata"].get("annotations") or {}).get(words.REQUEST_ANNOTATION))
        assert at
        warning = eventually(
            lambda: next((m for r, m in reasons(kube, name) if r == "PrestageTimedOut"), None),
            timeout=10,
            what="the timeout's warning",
        )
        assert f"no answer yet from {SILENT_NODE}" in warning
        # the plugin that follows asks answered it: skipped, no volume of it here
        assert answers(kube, NODE)[one.rsplit("@", 1)[1]].state == words.SKIPPED
    finally:
        kube.delete(ObjectRef("", "v1", "Node", "", SILENT_NODE))


def test_the_advert_keeps_at_most_its_limit_of_labels(
    kube: Kube,
    plugin: tuple[PrestageWatch, OwnRegistry],
    images: ImageCache,
    registry: Any,
    tmp_path: Path,
) -> None:
    watch, _ = plugin
    pins = [
        push(tmp_path / f"v{i}", f"{registry.host}/prestage/many-{SUFFIX}:v{i}", f"many {i}")
        for i in range(5)
    ]
    for i, pin in enumerate(pins):
        images.ensure(
            pin,
            platform=PLATFORM,
            pull_policy=PullPolicy.IF_NOT_PRESENT,
            holder=Holder(
                target=f"/var/lib/kubelet/pods/m{i}/volumes/b", volume_id=f"m{i}", image=pin
            ),
        )
    watch.advertise()
    advertised = {k for k in labels(kube, NODE) if k.startswith(words.CACHED_PREFIX)}
    assert len(advertised) == 3
    assert all(len(k.split("/", 1)[1]) == 63 for k in advertised)


def test_a_stopped_plugin_takes_its_nodes_enabled_label_back(
    kube: Kube,
    kube_apiserver: Any,
    images: ImageCache,
    plugin: tuple[PrestageWatch, OwnRegistry],
) -> None:
    """A plugin stopped for good (SIGTERM: its pod deleted) must not hold pivots: its Node
    is no longer labelled as one that answers asks, while the other Node's label stays."""
    gone = f"prestage-gone-{SUFFIX}"
    watch = follow(kube, kube_apiserver, images, gone)
    try:
        watch.stop()
        assert words.ENABLED_LABEL not in labels(kube, gone)
        assert labels(kube, NODE).get(words.ENABLED_LABEL) == "true"
    finally:
        watch.stop()
        kube.delete(ObjectRef("", "v1", "Node", "", gone))
