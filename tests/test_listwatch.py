"""The list+watch helper and its informer cache, against a real kube-apiserver, through
both sources: the provisioner's HTTP adapter and the node plugin's official client (which
follows ClusterBundlePolicies with it).

A forced 410 Gone (a watch from a resourceVersion the server no longer keeps)
must re-list and carry on without losing a change; bookmarks advance the
resourceVersion; failures back off (checked with a stand-in client, pure logic).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from csi.node.apisource import ClientSource
from csi.node.policies import PolicyWatch
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef
from rukpak.common import errors
from rukpak.common.backoff import Backoff
from rukpak.kube import listwatch
from tests.bundles import configmap, crd, namespace, widget
from tests.e2e_helpers import api
from tests.polling import eventually

pytestmark = pytest.mark.cluster


class Recorder:
    """Handler calls, in order, as ``(what, name)``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def add(self, obj: Obj) -> None:
        self.calls.append(("add", obj["metadata"]["name"]))

    def update(self, old: Obj, new: Obj) -> None:
        assert old["metadata"]["name"] == new["metadata"]["name"]
        self.calls.append(("update", new["metadata"]["name"]))

    def delete(self, obj: Obj) -> None:
        self.calls.append(("delete", obj["metadata"]["name"]))

    def informer(
        self, kube: Kube, ns: str, *, api_version: str = "v1", kind: str = "ConfigMap", **kw: Any
    ) -> listwatch.Informer:
        return listwatch.Informer(
            kube,
            api_version,
            kind,
            namespace=ns,
            label_selector="watched=yes",
            on_add=self.add,
            on_update=self.update,
            on_delete=self.delete,
            **kw,
        )


def labelled(name: str, ns: str, **data: str) -> Obj:
    obj = configmap(name, ns, **data)
    obj["metadata"]["labels"] = {"watched": "yes"}
    return obj


@pytest.fixture
def ns(kube: Kube, name: str) -> Iterator[str]:
    kube.apply(namespace(name))
    yield name
    kube.delete(ObjectRef("", "v1", "Namespace", "", name))


def test_the_informer_lists_then_follows_adds_updates_and_deletes(kube: Kube, ns: str) -> None:
    kube.apply(labelled("before", ns))
    kube.apply(configmap("unlabelled", ns))
    seen = Recorder()
    informer = seen.informer(kube, ns)
    informer.start()
    try:
        assert informer.wait_synced(10)
        assert informer.keys() == [(ns, "before")]
        assert seen.calls == [("add", "before")]

        kube.apply(labelled("after", ns, k="1"))
        kube.apply(labelled("after", ns, k="2"))
        assert kube.delete(ObjectRef("", "v1", "ConfigMap", ns, "before"))
        informer.wait(lambda: informer.get(ns, "before") is None, timeout=10)
        informer.wait(lambda: (informer.get(ns, "after") or {}).get("data") == {"k": "2"}, 10)
        assert seen.calls[:2] == [("add", "before"), ("add", "after")]
        assert seen.calls[-1] == ("delete", "before")
        assert ("update", "after") in seen.calls
        assert informer.listwatch.lists == 1
    finally:
        informer.stop()


def test_a_410_gone_relists_and_the_handlers_see_what_changed_meanwhile(
    kube: Kube, ns: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A CRD made now: its watch cache starts at the current resourceVersion, so a
    # watch from any resourceVersion before it gets a real 410 Gone from the server.
    _, before_crd = kube.list("v1", "Namespace")
    group = f"{ns}.example.com"
    api_version = f"{group}/v1"
    kube.apply(crd(group))
    eventually(lambda: kube.serves(api_version, "Widget"), timeout=30, what="Widgets served")

    def labelled_widget(name: str, size: int) -> Obj:
        obj = widget(group, "v1", name, {"size": size})
        obj["metadata"].update(namespace=ns, labels={"watched": "yes"})
        return obj

    kube.apply(labelled_widget("kept", 1))
    kube.apply(labelled_widget("dropped", 1))
    real_list = kube.list
    lists: list[str] = []

    def stale_first_list(*args: Any, **kw: Any) -> tuple[list[Obj], str]:
        items, rv = real_list(*args, **kw)
        lists.append(rv)
        if len(lists) > 1:
            return items, rv
        # the first answer is stale: the objects change after it, and its resourceVersion
        # is one the server no longer keeps events for
        kube.apply(labelled_widget("kept", 2))
        kube.delete(ObjectRef(group, "v1", "Widget", ns, "dropped"))
        return items, before_crd

    monkeypatch.setattr(kube, "list", stale_first_list)
    seen = Recorder()
    informer = seen.informer(kube, ns, api_version=api_version, kind="Widget")
    informer.start()
    try:
        informer.wait(lambda: informer.listwatch.lists >= 2, timeout=15)
        assert seen.calls[:2] == [("add", "dropped"), ("add", "kept")]
        assert sorted(seen.calls[2:]) == [("delete", "dropped"), ("update", "kept")]
        assert informer.keys() == [(ns, "kept")]
        assert (informer.get(ns, "kept") or {})["spec"] == {"size": 2}
    finally:
        informer.stop()
        kube.delete(
            ObjectRef(
                "apiextensions.k8s.io", "v1", "CustomResourceDefinition", "", f"widgets.{group}"
            )
        )


def test_bookmarks_advance_the_resource_version_without_a_change(kube: Kube, ns: str) -> None:
    """Writes in another namespace move the server's ConfigMap resourceVersion on; the
    watch of ``ns`` gets no event, but the bookmark the server sends shortly before it
    ends the watch carries the newer resourceVersion, and the next watch starts there."""
    other = f"{ns}-other"
    kube.apply(namespace(other))
    bookmarks: list[str] = []
    events: list[str] = []
    stop = threading.Event()
    lw = listwatch.ListWatch(
        kube,
        "v1",
        "ConfigMap",
        namespace=ns,
        on_bookmark=bookmarks.append,
        on_event=lambda type_, obj: events.append(type_),
        stop=stop,
        watch_timeout=4,  # bookmarks come about 2 s before the server ends a watch
    )
    thread = threading.Thread(target=lw.run, daemon=True)
    thread.start()
    try:
        listed = int(eventually(lambda: lw.resource_version if lw.lists else "", what="a list"))
        ticks = iter(range(1000))

        def bookmarked_past_the_list() -> bool:
            kube.apply(configmap("tick", other, n=str(next(ticks))))  # elsewhere
            return any(int(rv) > listed for rv in bookmarks)

        eventually(bookmarked_past_the_list, timeout=30, interval=1.0, what="a newer bookmark")
        assert int(lw.resource_version) > listed
        assert events == []
    finally:
        stop.set()
        thread.join(10)
        kube.delete(ObjectRef("", "v1", "Namespace", "", other))


class FlakyKube:
    """A stand-in client for the pure backoff logic: lists fail twice, then work."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop = stop
        self.list_calls = 0

    def list(self, *args: Any, **kw: Any) -> tuple[list[Obj], str]:
        self.list_calls += 1
        if self.list_calls <= 2:
            raise errors.Unavailable("list ConfigMap: API server unreachable")
        return [], "7"

    def watch(self, *args: Any, resource_version: str, **kw: Any) -> Iterator[tuple[str, Obj]]:
        assert resource_version == "7"
        self.stop.set()
        yield from ()


def test_failures_wait_the_bounded_backoff_before_retrying() -> None:
    waits: list[float | None] = []

    class RecordingStop(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            waits.append(timeout)
            return False

    recording = RecordingStop()
    fake = FlakyKube(recording)
    heard: list[str] = []
    lw = listwatch.ListWatch(
        fake,  # type: ignore[arg-type]
        "v1",
        "ConfigMap",
        stop=recording,
        backoff=Backoff(base=0.5, cap=0.75),
        on_error=heard.append,
    )
    lw.run()
    assert waits == [0.5, 0.75]
    assert fake.list_calls == 3 and lw.watches == 1
    # told once when following started failing (not on each retry), cleared by the list
    assert heard == ["list ConfigMap: API server unreachable"] and lw.error == ""


def test_end_stops_one_loop_in_its_pause_and_leaves_the_shared_stop_alone() -> None:
    waits: list[float | None] = []
    shared = threading.Event()

    class Failing:
        def list(self, *args: Any, **kw: Any) -> tuple[list[Obj], str]:
            raise errors.Unavailable("list ConfigMap: API server unreachable")

    class EndingStop(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            waits.append(timeout)
            lw.end()  # dropped while it pauses after a failure
            return shared.wait(0)

    lw = listwatch.ListWatch(
        Failing(),  # type: ignore[arg-type]
        "v1",
        "ConfigMap",
        stop=EndingStop(),
        backoff=Backoff(base=0.5, cap=0.75),
    )
    lw.run()  # returns: it would retry forever otherwise
    assert waits == [0.5] and lw.ended and lw.lists == 0
    assert not lw.stop.is_set() and not shared.is_set()


# -- the node plugin's source: the official client, same informer -------------------------


@pytest.fixture
def api_client(kube_apiserver: Any) -> Iterator[Any]:
    made = api(kube_apiserver)
    try:
        yield made
    finally:
        made.close()  # type: ignore[no-untyped-call]


def test_the_official_client_source_feeds_the_same_informer_and_relists_after_a_410(
    kube: Kube, ns: str, api_client: Any
) -> None:
    group = f"{ns}.example.com"
    api_version = f"{group}/v1"
    _, before_crd = kube.list("v1", "Namespace")
    kube.apply(crd(group))
    eventually(lambda: kube.serves(api_version, "Widget"), timeout=30, what="Widgets served")
    try:
        source = ClientSource(api_client, plurals={"Widget": "widgets"})
        first = widget(group, "v1", "first", {"size": 1})
        first["metadata"]["namespace"] = ns
        kube.apply(first)
        items, rv = source.list(api_version, "Widget", namespace=ns)
        assert [(i["kind"], i["metadata"]["name"]) for i in items] == [("Widget", "first")]
        assert rv
        # a resourceVersion older than the CRD: the server answers 410, the source says Gone
        with pytest.raises(listwatch.Gone):
            list(source.watch(api_version, "Widget", namespace=ns, resource_version=before_crd))

        seen = Recorder()
        informer = listwatch.Informer(
            source,
            api_version,
            "Widget",
            namespace=ns,
            on_add=seen.add,
            on_update=seen.update,
            on_delete=seen.delete,
        )
        informer.start()
        try:
            assert informer.wait_synced(10)
            second = widget(group, "v1", "second", {"size": 2})
            second["metadata"]["namespace"] = ns
            kube.apply(second)
            assert kube.delete(ObjectRef(group, "v1", "Widget", ns, "first"))
            informer.wait(lambda: informer.keys() == [(ns, "second")], timeout=10)
            assert seen.calls == [("add", "first"), ("add", "second"), ("delete", "first")]
        finally:
            informer.stop()
    finally:
        kube.delete(
            ObjectRef(
                "apiextensions.k8s.io", "v1", "CustomResourceDefinition", "", f"widgets.{group}"
            )
        )


def test_the_official_client_source_names_what_is_not_served_and_what_it_does_not_follow(
    api_client: Any,
) -> None:
    source = ClientSource(api_client, plurals={"Gadget": "gadgets"})
    with pytest.raises(errors.NotFound, match="cannot list Gadget: 404"):
        source.list("nothing.example.com/v1", "Gadget")
    not_followed = r"Widget of x\.example\.com/v1 is not followed"
    with pytest.raises(errors.InvalidArgument, match=not_followed):
        source.list("x.example.com/v1", "Widget")


def test_the_node_plugin_follows_cluster_bundle_policies_through_the_core_informer(
    kube: Kube, api_client: Any
) -> None:
    """``csi.node.policies.PolicyWatch`` on the real API server: the CRD from
    provisioner/crds, a policy made, changed and deleted, each seen by ``policies()``."""
    root = Path(__file__).resolve().parent.parent
    for doc in yaml.safe_load_all(
        (root / "provisioner/crds/core.rukpak.io_clusterbundlepolicies.yaml").read_text()
    ):
        if doc:
            kube.apply(doc)
    eventually(
        lambda: kube.serves("core.rukpak.io/v1alpha1", "ClusterBundlePolicy"),
        timeout=30,
        what="ClusterBundlePolicy served",
    )
    name = f"lw-{uuid.uuid4().hex[:8]}"
    policy: dict[str, Any] = {
        "apiVersion": "core.rukpak.io/v1alpha1",
        "kind": "ClusterBundlePolicy",
        "metadata": {"name": name},
        "spec": {
            "images": [{"glob": "registry.example.com/**"}],
            "authorities": [{"name": "release", "key": {"secretRef": {"name": "k"}}}],
        },
    }
    watch = PolicyWatch(api_client, namespace="rukpak-system").start()
    ref = ObjectRef("core.rukpak.io", "v1alpha1", "ClusterBundlePolicy", "", name)
    try:
        assert name not in [p.name for p in watch.policies()]
        kube.apply(policy)
        eventually(
            lambda: [p for p in watch.policies() if p.name == name],
            timeout=10,
            what="policy seen",
        )
        policy["spec"]["images"] = [{"glob": "other.example.com/**"}]
        kube.apply(policy)
        eventually(
            lambda: [p for p in watch.policies() if p.name == name and p.generation == 2],
            timeout=10,
            what="policy change seen",
        )
        assert kube.delete(ref)
        eventually(
            lambda: name not in [p.name for p in watch.policies()],
            timeout=10,
            what="policy deletion seen",
        )
    finally:
        watch.stop()
        kube.delete(ref)


def test_a_missing_crd_means_no_policies_once_listed(api_client: Any) -> None:
    """The plugin's view when ClusterBundlePolicy is not served: synced, and empty (a
    publish is not refused as UNAVAILABLE for want of a CRD)."""
    informer = listwatch.Informer(
        ClientSource(api_client, plurals={"Gadget": "gadgets"}, absent_is_empty=True),
        "nothing.example.com/v1",
        "Gadget",
    )
    informer.start()
    try:
        assert informer.wait_synced(10)
        assert informer.items() == []
    finally:
        informer.stop()
