"""A set of informers sharing one client and one set of options, against a real
kube-apiserver: the set's options reach every informer unless ``add`` overrides them,
``start`` starts what is new, ``wait_synced`` names what has not listed, ``stop`` ends
them all, ``drop`` one alone."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from provisioner.engine.kube.informers import InformerSet
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef
from tests.bundles import configmap, namespace
from tests.polling import eventually

pytestmark = pytest.mark.cluster


@pytest.fixture
def ns(kube: Kube, name: str) -> Iterator[str]:
    kube.apply(namespace(name))
    yield name
    kube.delete(ObjectRef("", "v1", "Namespace", "", name))


def labelled(name: str, ns: str, label: str) -> Obj:
    obj = configmap(name, ns)
    obj["metadata"]["labels"] = {label: "yes"}
    return obj


def test_the_set_options_reach_every_informer_unless_add_overrides_them(
    kube: Kube, ns: str
) -> None:
    stop = threading.Event()
    caches = InformerSet(kube, namespace=ns, label_selector="watched=yes", stop=stop)
    selected = caches.add("v1", "ConfigMap")
    everything = caches.add("v1", "ConfigMap", label_selector="")
    assert selected.listwatch.stop is stop and everything.listwatch.stop is stop
    assert (selected.listwatch.namespace, selected.listwatch.label_selector) == (ns, "watched=yes")
    assert (everything.listwatch.namespace, everything.listwatch.label_selector) == (ns, "")
    assert list(caches) == [selected, everything]


def test_start_wait_and_stop_act_on_every_informer_added_so_far(kube: Kube, ns: str) -> None:
    kube.apply(labelled("watched", ns, "watched"))
    kube.apply(labelled("plain", ns, "plain"))
    seen: list[str] = []
    caches = InformerSet(kube, namespace=ns, stop=threading.Event(), watch_timeout=10)
    watched = caches.add("v1", "ConfigMap", label_selector="watched=yes")
    caches.start()
    try:
        assert caches.wait_synced(10) == []
        assert watched.keys() == [(ns, "watched")]
        later = caches.add(
            "v1",
            "ConfigMap",
            label_selector="plain=yes",
            on_add=lambda obj: seen.append(obj["metadata"]["name"]),
        )
        assert caches.wait_synced(0) == [later]  # added, not started: no list yet
        caches.start()  # starts the new one only
        assert caches.wait_synced(10) == []
        assert later.keys() == [(ns, "plain")]
        assert seen == ["plain"]
        assert watched.listwatch.lists == 1  # one thread per informer: listed once
    finally:
        caches.stop(timeout=10)
    assert watched.listwatch.stop.is_set() and later.listwatch.stop.is_set()


def test_drop_ends_one_informer_and_the_others_go_on_following(kube: Kube, ns: str) -> None:
    kube.apply(labelled("first", ns, "watched"))
    stop = threading.Event()
    # a short server timeout: the dropped one ends when its watch under way does
    caches = InformerSet(
        kube, namespace=ns, label_selector="watched=yes", stop=stop, watch_timeout=2
    )
    dropped, kept = caches.add("v1", "ConfigMap"), caches.add("v1", "ConfigMap")
    caches.start()
    try:
        assert caches.wait_synced(10) == []
        caches.drop(dropped)
        caches.drop(dropped)  # not in the set any more: ignored
        assert list(caches) == [kept]
        eventually(lambda: not dropped.running, timeout=15, what="the dropped informer ended")
        assert not stop.is_set() and kept.running
        kube.apply(labelled("second", ns, "watched"))
        kept.wait(lambda: kept.get(ns, "second"), timeout=15)
        assert dropped.keys() == [(ns, "first")]  # ended before "second" was made
        later = caches.add("v1", "ConfigMap")
        caches.start()  # the set still knows which of its informers are started
        assert caches.wait_synced(10) == [] and later.running and not dropped.running
        assert later.keys() == [(ns, "first"), (ns, "second")]
    finally:
        caches.stop(timeout=10)
