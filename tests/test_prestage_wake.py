"""The manager's pre-stage gate without polling (pure rules): which held pivots a Node change
wakes (``prestage.woken``), when a held pivot looks again by itself (its timeout: one
timer), and that with the Nodes read from a cache the gate sends no request to decide.

The same against a real kube-apiserver (the informer, the wake-up, counted requests) is in
``test_prestage_cluster``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from provisioner.manager.acting import prestage
from rukpak.common import prestage as words

D1 = "sha256:" + "1" * 64
D2 = "sha256:" + "2" * 64
IMAGE = f"registry.example/app@{D1}"
AT = "2026-01-01T00:00:00.000Z"
AT_SECONDS = 1767225600.0
ON = {words.ENABLED_LABEL: "true"}


def node(name: str = "n1", labels: dict[str, str] | None = None, **answers: Any) -> Any:
    """A NodeView answering ``{digest: (state, asked, bytes)}``."""
    states = {
        digest: {"state": state, "asked": asked, "bytes": done, "total": 100, "at": 1.0}
        for digest, (state, asked, done) in answers.pop("states", {}).items()
    }
    notes = {words.STATE_ANNOTATION: json.dumps(states)} if states else {}
    return words.NodeView(name, ON if labels is None else labels, notes)


class NoRequests:
    """A Kube that fails the test on any request."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the gate sent a request: Kube.{name}")


class Recorder:
    """A Kube that records the writes asked of it (merge patches, Events)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def merge_patch(self, ref: Any, patch: Any) -> dict[str, Any]:
        self.calls.append("merge_patch")
        return {}

    def create(self, body: Any) -> dict[str, Any]:
        self.calls.append(f"event {body.get('reason')}")
        return {}

    def list(self, *args: Any, **kwargs: Any) -> tuple[list[Any], str]:
        self.calls.append("list")
        return [], "1"


def bd(name: str = "app", *, asked: bool = True, timeout: str | None = None) -> dict[str, Any]:
    notes = {words.REQUEST_ANNOTATION: prestage.ask_value([IMAGE], 3, AT)} if asked else {}
    if timeout is not None:
        notes[words.TIMEOUT_ANNOTATION] = timeout
    return {
        "apiVersion": "core.rukpak.io/v1alpha2",
        "metadata": {"name": name, "annotations": notes, "generation": 3},
    }


def gate(nodes: list[Any] | None, *, now: float = AT_SECONDS + 10) -> prestage.Gate:
    g = prestage.Gate(timeout=120, clock=lambda: now)
    g.follow(lambda: nodes)
    return g


# --- which Node changes wake which held pivots ---------------------------------------------


def test_an_answer_for_a_held_digest_wakes_its_bundledeployment() -> None:
    held = {"app": frozenset({D1}), "other": frozenset({D2})}
    before = node(states={D1: ("fetching", AT, 10)})
    after = node(states={D1: ("cached", AT, 100)})
    assert prestage.woken(held, before, after) == ["app"]


def test_progress_of_a_fetch_wakes_nobody() -> None:
    held = {"app": frozenset({D1})}
    before = node(states={D1: ("fetching", AT, 10)})
    after = node(states={D1: ("fetching", AT, 60)})
    assert prestage.woken(held, before, after) == []


def test_an_answer_to_a_new_ask_wakes_even_with_the_same_state() -> None:
    held = {"app": frozenset({D1})}
    before = node(states={D1: ("skipped", "2025-01-01T00:00:00.000Z", 0)})
    after = node(states={D1: ("skipped", AT, 0)})
    assert prestage.woken(held, before, after) == ["app"]


@pytest.mark.parametrize(
    ("before", "after"),
    [
        (None, node()),  # a Node starts following asks: now waited for, or...
        (node(), None),  # ...one stops (or goes): no longer waited for
        (node(labels={}), node()),  # labelled while the informer saw it unlabelled
    ],
)
def test_a_node_that_starts_or_stops_following_asks_wakes_every_held_pivot(
    before: Any, after: Any
) -> None:
    held = {"a": frozenset({D1}), "b": frozenset({D2})}
    assert prestage.woken(held, before, after) == ["a", "b"]


def test_a_change_of_nothing_asked_wakes_nobody() -> None:
    held = {"app": frozenset({D1})}
    relabelled = words.NodeView("n1", {**ON, "zone": "b"}, {})
    assert prestage.woken(held, node(), relabelled) == []
    assert prestage.woken({}, None, node(states={D1: ("cached", AT, 100)})) == []


@pytest.mark.parametrize(
    ("conditions", "answering"),
    [
        ([], True),  # created without a status (no kubelet yet)
        ([{"type": "Ready", "status": "True"}], True),
        ([{"type": "Ready", "status": "Unknown"}], False),  # its kubelet stopped reporting
        ([{"type": "Ready", "status": "False"}], False),
        ([{"type": "MemoryPressure", "status": "False"}], True),
    ],
)
def test_a_node_whose_kubelet_is_known_down_is_not_waited_for(
    conditions: list[dict[str, str]], answering: bool
) -> None:
    obj = {"metadata": {"name": "n1", "labels": ON}, "status": {"conditions": conditions}}
    assert prestage.answering(obj) is answering


# --- the gate: its cache, its timer, what it remembers ---------------------------------------


def test_with_no_following_node_the_gate_pivots_at_once_without_a_request() -> None:
    g = gate([])
    assert g.hold(NoRequests(), bd(asked=False), [IMAGE], generation=3) is None  # type: ignore[arg-type]
    assert g.held() == {}


def test_with_pre_staging_off_the_gate_reads_nothing() -> None:
    g = prestage.Gate(timeout=0)
    g.follow(lambda: pytest.fail("the Nodes were read"))
    assert g.hold(NoRequests(), bd(asked=False), [IMAGE], generation=3) is None  # type: ignore[arg-type]
    assert g.hold(NoRequests(), bd(timeout="0"), [IMAGE], generation=3) is None  # type: ignore[arg-type]


def test_a_held_pivot_looks_again_at_its_timeout_not_sooner() -> None:
    g = gate([node()], now=AT_SECONDS + 10)
    kube = Recorder()
    wait = g.hold(kube, bd(), [IMAGE], generation=3)  # type: ignore[arg-type]
    assert wait == pytest.approx(110.0)  # the ask was 10 s ago; 120 s timeout
    assert g.held() == {"app": frozenset({D1})}
    assert kube.calls == []  # the Nodes came from the cache; nothing written


def test_a_new_ask_is_written_and_held_for_the_whole_timeout() -> None:
    g = gate([node()])
    kube = Recorder()
    wait = g.hold(kube, bd(asked=False), [IMAGE], generation=3)  # type: ignore[arg-type]
    assert wait == 120.0
    assert kube.calls == ["merge_patch", "event Prestaging"]
    assert "app" in g.held()


def test_the_pivot_is_held_before_the_nodes_are_read_so_no_answer_is_missed() -> None:
    g = prestage.Gate(timeout=120, clock=lambda: AT_SECONDS + 10)
    seen: list[dict[str, frozenset[str]]] = []
    g.follow(lambda: seen.append(g.held()) or [node()])  # type: ignore[func-returns-value]
    g.hold(Recorder(), bd(), [IMAGE], generation=3)  # type: ignore[arg-type]
    assert seen == [{"app": frozenset({D1})}]


def test_a_pivot_that_goes_on_is_no_longer_held() -> None:
    answers = [node()]
    g = gate(answers)
    kube = Recorder()
    assert g.hold(kube, bd(), [IMAGE], generation=3) is not None  # type: ignore[arg-type]
    answers[0] = node(states={D1: ("cached", AT, 100)})
    assert g.hold(kube, bd(), [IMAGE], generation=3) is None  # type: ignore[arg-type]
    assert g.held() == {}
    assert kube.calls == ["event Prestaged"]


def test_a_held_pivot_past_its_timeout_goes_on_with_a_warning() -> None:
    g = gate([node()], now=AT_SECONDS + 121)
    kube = Recorder()
    assert g.hold(kube, bd(), [IMAGE], generation=3) is None  # type: ignore[arg-type]
    assert kube.calls == ["event PrestageTimedOut"]
    assert g.held() == {}


def test_a_bundledeployment_held_long_past_its_timeout_is_forgotten() -> None:
    now = [AT_SECONDS + 10]
    g = prestage.Gate(timeout=120, clock=lambda: now[0])
    g.follow(lambda: [node()])
    g.hold(Recorder(), bd(), [IMAGE], generation=3)  # type: ignore[arg-type]
    fetched = node(states={D1: ("cached", AT, 100)})
    assert g.woken(node(), fetched) == ["app"]
    now[0] = AT_SECONDS + 120 + prestage.STALE_AFTER + 1
    assert g.woken(node(), fetched) == []
    assert g.held() == {}


def test_a_gone_bundledeployment_is_forgotten() -> None:
    g = gate([node()])
    g.hold(Recorder(), bd(), [IMAGE], generation=3)  # type: ignore[arg-type]
    g.forget("app")
    assert g.held() == {}


def test_without_a_synced_cache_the_gate_lists_the_nodes_and_polls() -> None:
    g = gate(None)  # the informer's first list is not in yet
    kube = Recorder()
    assert g.hold(kube, bd(), [IMAGE], generation=3) is None  # type: ignore[arg-type]
    assert kube.calls == ["list"]  # no following node listed: pivots
    listed = [
        {"metadata": {"name": "n1", "labels": ON}},
        {"metadata": {"name": "down", "labels": ON}, "status": {"conditions": [
            {"type": "Ready", "status": "Unknown"}]}},
    ]  # fmt: skip
    kube.list = lambda *a, **k: (listed, "1")  # type: ignore[method-assign]
    assert g.hold(kube, bd(), [IMAGE], generation=3) == prestage.POLL_SECONDS  # type: ignore[arg-type]


# --- on by default --------------------------------------------------------------------------


def test_the_manager_pre_stages_by_default_and_zero_turns_it_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import argparse

    from provisioner.manager import cli

    monkeypatch.delenv("PRESTAGE_TIMEOUT", raising=False)

    def parse(*argv: str) -> argparse.Namespace:
        parser = argparse.ArgumentParser()
        cli.register(parser.add_subparsers())
        return parser.parse_args(["manager", *argv])

    assert parse().prestage_timeout == prestage.DEFAULT_TIMEOUT == 120.0
    assert parse("--prestage-timeout", "0").prestage_timeout == 0.0
    monkeypatch.setenv("PRESTAGE_TIMEOUT", "0")
    assert parse().prestage_timeout == 0.0


def test_deploy_runs_the_manager_with_pre_staging_on() -> None:
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parent.parent
    deployment = yaml.safe_load((root / "deploy/manager/deployment.yaml").read_text())
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--prestage-timeout={prestage.DEFAULT_TIMEOUT:g}" in args
