"""Pre-staged pivots end to end on the multi-node local cluster, RukPak installed from
``deploy/`` (``multinode_system``; its node plugins run ``--prestage=follow``).

A BundleDeployment whose content a DaemonSet mounts on every node pivots to a new digest:
with ``prestage.rukpak.io/timeout`` set, the pin is written only once every node that
holds the repository has fetched the new digest (each node's answer and the advert label
say so, progress events were posted), so the DaemonSet's roll finds the content on every
node. Figures (with vs without, same run) are ``make bench`` (``bench_prestage``).
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from rukpak.common import prestage as words
from tests import install_helpers as inst
from tests import multinode_helpers as mn
from tests import prestage_helpers as ph

pytestmark = [pytest.mark.multinode, pytest.mark.cluster, pytest.mark.slow]

SUFFIX = uuid.uuid4().hex[:6]
PAYLOAD = 8 * 2**20


def events_of(system: inst.RukpakSystem, name: str) -> list[tuple[str, str]]:
    items = json.loads(system.kubectl("get", "events", "-n", "default", "-o", "json"))["items"]
    return [
        (str(e.get("reason")), str(e.get("message")))
        for e in items
        if (e.get("involvedObject") or {}).get("name") == name
    ]


def test_a_pivot_is_pinned_only_once_every_node_holding_the_bundle_has_fetched_it(
    multinode_system: inst.RukpakSystem, tmp_path: Path
) -> None:
    system = multinode_system
    nodes = sorted(system.cluster.node_names)
    name = f"prestage-{SUFFIX}"
    ns, _ = ph.prepare(system, tmp_path, name=name, payload=PAYLOAD, prestage=300)
    # every plugin follows asks
    labelled = system.kubectl("get", "nodes", "-l", f"{words.ENABLED_LABEL}=true", "-o", "name")
    assert len(labelled.split()) == len(nodes)

    done = ph.pivot(system, tmp_path, name=name, ns=ns, payload=PAYLOAD)
    digest = done.v2.rsplit("@", 1)[1]
    answers = ph.node_answers(system)
    for node in nodes:
        answer = answers[node][digest]
        assert answer.state == words.CACHED, (node, answer)
        assert answer.bytes == answer.total > PAYLOAD, (node, answer)
        # the tree is in that node's own cache
        assert (
            mn.state_dir_of(system.cluster, node)
            / "images"
            / "unpacked"
            / digest.removeprefix("sha256:")
        ).is_dir()
    # a scheduler can prefer these nodes: the advert label selects all three
    assert ph.nodes_advertising(system, digest) == nodes
    said = events_of(system, name)
    assert any(r == "Prestaged" and done.v2 in m for r, m in said), said
    progress = [m for r, m in said if r == "PrestageProgress" and digest in m]
    assert {n for n in nodes if any(f"node {n}:" in m and "(100%)" in m for m in progress)} == set(
        nodes
    )
    system.kubectl("delete", "namespace", ns, "--wait=false")
    system.kubectl("delete", "bundledeployments.v1alpha2.core.rukpak.io", name, "--wait=false")


def test_a_bundledeployment_without_the_annotation_pivots_without_asking(
    multinode_system: inst.RukpakSystem, tmp_path: Path
) -> None:
    system = multinode_system
    name = f"prestage-off-{SUFFIX}"
    ns, _ = ph.prepare(system, tmp_path, name=name, payload=2**20, prestage=0)
    done = ph.pivot(system, tmp_path, name=name, ns=ns, payload=2**20)
    bd = ph.live(system, name)
    assert words.REQUEST_ANNOTATION not in (bd["metadata"].get("annotations") or {})
    assert not any(r.startswith("Prestag") for r, _ in events_of(system, name))
    assert done.serving >= done.pinned
    system.kubectl("delete", "namespace", ns, "--wait=false")
    system.kubectl("delete", "bundledeployments.v1alpha2.core.rukpak.io", name, "--wait=false")
