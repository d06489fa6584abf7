"""spec.healthChecks: parsing, one probe over the installed objects, and probing over time."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from provisioner.engine.health import healthchecks as hc
from provisioner.engine.health.health import Health


def deployment(
    name: str = "web",
    *,
    namespace: str = "ns",
    ready: int = 3,
    available: str = "True",
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A Deployment wanting 3 replicas with ``ready`` of them ready."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {"tier": "front"}},
        "spec": {"replicas": 3},
        "status": {
            "readyReplicas": ready,
            "conditions": [{"type": "Available", "status": available, "reason": "Replicas"}],
        },
    }


def configmap(name: str = "settings", **data: str) -> dict[str, Any]:
    meta = {"name": name, "namespace": "ns"}
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def one(raw: dict[str, Any]) -> hc.Check:
    """The single check ``raw`` parses to, with no problems."""
    checks, problems = hc.parse([raw])
    assert problems == []
    return checks[0]


def check(*assertions: dict[str, Any], **selector: Any) -> hc.Check:
    return one({"name": "c", "selector": selector, "assertions": list(assertions)})


def failures(c: hc.Check, *objects: dict[str, Any]) -> list[str]:
    return list(hc.evaluate(c, objects).failures)


# --- parsing -------------------------------------------------------------------------------


def test_a_check_parses_with_the_pod_probe_defaults() -> None:
    c = check({"condition": {"type": "Available"}}, group="apps", kind="Deployment")
    assert c.selector == hc.Selector(group="apps", kind="Deployment")
    assert c.assertions == (hc.ConditionIs("Available", "True"),)
    timing = (c.initial_delay, c.period, c.timeout, c.failure_threshold, c.success_threshold)
    assert timing == (0, 10, 1, 3, 1)


def test_an_unnamed_check_is_named_by_its_index_and_names_must_be_unique() -> None:
    checks, problems = hc.parse([{"name": "check-1"}, {}, {"name": "x"}])
    assert [c.name for c in checks] == ["check-1", "x"]
    assert problems == ["spec.healthChecks[1].name: 'check-1' is used by an earlier check"]


def test_an_absent_field_is_no_checks() -> None:
    assert hc.parse(None) == ([], [])


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ({"a": 1}, "spec.healthChecks: must be a list of checks, not an object"),
        (["x"], "spec.healthChecks[0]: must be an object, not a string"),
        ([{"failureThreshold": 0}], "[0].failureThreshold: must be between 1 and"),
        ([{"initialDelaySeconds": -5}], "[0].initialDelaySeconds: must be between 0 and"),
        ([{"periodSeconds": "10"}], '[0].periodSeconds: must be an integer, not "10"'),
        ([{"successThreshold": True}], "[0].successThreshold: must be an integer, not true"),
        ([{"timeoutSeconds": 1.5}], "[0].timeoutSeconds: must be an integer, not 1.5"),
        ([{"probe": {}}], "[0]: unknown field 'probe'"),
        ([{"selector": "web"}], "[0].selector: must be an object, not a string"),
        ([{"selector": {"labels": {}}}], "[0].selector: unknown field 'labels'"),
        ([{"selector": {"matchLabels": {"a": 1}}}], "[0].selector.matchLabels: must map"),
        ([{"assertions": {"cel": "true"}}], "[0].assertions: must be a list, not an object"),
        ([{"assertions": [{"exists": True}]}], "[0].assertions[0]: unknown assertion 'exists'"),
        ([{"assertions": [{"cel": "true", "field": {}}]}], "[0].assertions[0]: must have exactly"),
        ([{"assertions": [{"condition": {"type": "Ready", "status": True}}]}], "status: must be"),
        ([{"assertions": [{"condition": {"status": "True"}}]}], "condition.type: must be a non-"),
        ([{"assertions": [{"field": {"path": ".a", "equals": 1, "matches": "b"}}]}], "exactly one"),
        ([{"assertions": [{"field": {"path": ".a", "match": "b"}}]}], "unknown field 'match'"),
        ([{"assertions": [{"field": {"path": ".a[x]", "equals": 1}}]}], "cannot read '.a[x]'"),
        ([{"assertions": [{"field": {"path": "", "equals": 1}}]}], "path: must name a field"),
        ([{"assertions": [{"field": {"path": ".a", "matches": "(x"}}]}], "missing ): (x"),
    ],
)
def test_broken_specs_are_problems_naming_the_index_and_field(spec: object, problem: str) -> None:
    checks, problems = hc.parse(spec)
    assert checks == []
    assert len(problems) == 1
    assert problem in problems[0]


def test_a_broken_check_does_not_hide_the_valid_ones() -> None:
    checks, problems = hc.parse([{"name": "good"}, {"name": 7}, {"name": "also-good"}])
    assert [c.name for c in checks] == ["good", "also-good"]
    assert problems == ["spec.healthChecks[1].name: must be a non-empty string, not 7"]


def test_cel_that_does_not_compile_is_a_problem_with_the_compiler_message() -> None:
    _, problems = hc.parse([{}, {"assertions": [{"cel": "object.spec.replicas >"}]}])
    assert problems[0].startswith("spec.healthChecks[1].assertions[0]: cel: 1:23: Syntax error")
    _, problems = hc.parse([{"assertions": [{"cel": "spec.replicas > 1"}]}])
    assert "undeclared reference to 'spec.replicas'" in problems[0]


def test_cel_that_cannot_give_a_bool_is_a_problem() -> None:
    _, problems = hc.parse([{"assertions": [{"cel": "size(object.metadata)"}]}])
    assert problems == ["spec.healthChecks[0].assertions[0]: cel: must evaluate to a bool, not int"]


def test_cel_with_many_chained_macros_is_refused() -> None:
    doubling = "[object.metadata.name]" + ".map(a, a + a)" * 30 + ".size() > 0"
    _, problems = hc.parse([{"assertions": [{"cel": doubling}]}])
    assert "cel: at most 4 macros" in problems[0]


# --- selecting objects ---------------------------------------------------------------------


def test_the_selector_matches_group_and_kind_with_the_empty_group_for_core() -> None:
    core = check(group="", kind="ConfigMap")
    apps = check(group="apps", kind="Deployment")
    assert hc.selects(core, configmap()) and not hc.selects(core, deployment())
    assert hc.selects(apps, deployment()) and not hc.selects(apps, configmap())
    assert hc.selects(check(), configmap())


def test_the_selector_matches_name_namespace_and_labels() -> None:
    web, api = deployment("web"), deployment("api", labels={"tier": "back", "app": "api"})
    assert [hc.selects(check(name="web"), d) for d in (web, api)] == [True, False]
    assert [hc.selects(check(namespace="other"), d) for d in (web, api)] == [False, False]
    by_labels = check(matchLabels={"tier": "back", "app": "api"})
    assert [hc.selects(by_labels, d) for d in (web, api)] == [False, True]


def test_objects_with_broken_metadata_are_not_selected() -> None:
    assert not hc.selects(check(), {"kind": "ConfigMap", "metadata": "oops"})
    assert not hc.selects(check(matchLabels={"a": "b"}), {"metadata": {"labels": ["a"]}})


def test_no_matching_object_is_a_failure() -> None:
    result = hc.evaluate(check(kind="StatefulSet"), [deployment()])
    assert result == hc.Result(False, ("check c: no object matches the selector",))


# --- assertions ----------------------------------------------------------------------------


def test_a_condition_assertion_names_the_status_found_and_the_status_wanted() -> None:
    available = check({"condition": {"type": "Available", "status": "True"}})
    assert failures(available, deployment()) == []
    assert failures(available, deployment(available="False")) == [
        "check c: Deployment ns/web: condition Available is False (want True): Replicas"
    ]
    assert failures(available, configmap()) == [
        "check c: ConfigMap ns/settings: condition Available is missing (want True)"
    ]


@pytest.mark.parametrize(
    ("value", "want", "holds"),
    [
        (3, 3, True),
        (3, 3.0, True),
        (3, "3", True),
        ("3", 3, True),
        (True, "true", True),
        ({"a": [1]}, {"a": [1]}, True),
        (1, True, False),
        ({"a": 1}, {"a": True}, False),
        (1, 3, False),
        (None, "x", False),
    ],
)
def test_field_equals_compares_json_values_or_their_text(
    value: Any, want: Any, holds: bool
) -> None:
    c = check({"field": {"path": ".status.v", "equals": want}})
    assert (
        hc.evaluate(c, [{"kind": "Thing", "metadata": {"name": "t"}, "status": {"v": value}}]).ok
        is holds
    )


def test_a_field_failure_names_the_path_the_value_and_the_wanted_value() -> None:
    c = check({"field": {"path": ".status.readyReplicas", "equals": 3}})
    assert failures(c, deployment(ready=1)) == [
        "check c: Deployment ns/web: field .status.readyReplicas is 1 (want 3)"
    ]


def test_field_paths_take_indexes_and_quoted_keys() -> None:
    obj = deployment(labels={"app.kubernetes.io/name": "web"})
    indexed = check({"field": {"path": ".status.conditions[0].type", "equals": "Available"}})
    last = check({"field": {"path": "status.conditions[-1].status", "equals": "True"}})
    quoted = check(
        {"field": {"path": ".metadata.labels['app.kubernetes.io/name']", "equals": "web"}}
    )
    assert [hc.evaluate(c, [obj]).ok for c in (indexed, last, quoted)] == [True, True, True]
    beyond = check({"field": {"path": ".status.conditions[5].type", "equals": "Available"}})
    assert "field .status.conditions[5].type is missing" in failures(beyond, obj)[0]


def test_a_path_into_something_not_an_object_is_a_failure() -> None:
    c = check({"field": {"path": ".spec.replicas.count", "equals": 3}})
    assert failures(c, deployment()) == [
        "check c: Deployment ns/web: field .spec.replicas.count is unreachable:"
        " .spec.replicas is a number, not an object (want 3)"
    ]
    listed = check({"field": {"path": ".metadata[0]", "equals": 3}})
    assert "unreachable: .metadata is an object, not a list" in failures(listed, deployment())[0]


def test_field_matches_takes_an_re2_pattern() -> None:
    front = check({"field": {"path": ".metadata.labels.tier", "matches": "^fr.*"}})
    assert failures(front, deployment()) == []
    assert failures(front, deployment(labels={"tier": "back"})) == [
        'check c: Deployment ns/web: field .metadata.labels.tier is "back" (want a match for ^fr.*)'
    ]
    digits = check({"field": {"path": ".status.readyReplicas", "matches": "^\\d+$"}})
    assert failures(digits, deployment()) == []


def test_a_catastrophic_pattern_runs_in_linear_time() -> None:
    c = check({"field": {"path": ".data.v", "matches": "^(a+)+$"}})
    assert not hc.evaluate(c, [configmap(v="a" * 50_000 + "b")]).ok


def test_cel_sees_the_object_as_object() -> None:
    c = check({"cel": "object.status.readyReplicas >= object.spec.replicas"})
    assert failures(c, deployment(ready=3)) == []
    assert failures(c, deployment(ready=2)) == [
        "check c: Deployment ns/web: cel `object.status.readyReplicas >= object.spec.replicas`"
        " is false"
    ]


def test_a_cel_evaluation_error_is_a_failure_with_its_message() -> None:
    c = check({"cel": "object.status.missing > 1"})
    assert failures(c, deployment()) == [
        "check c: Deployment ns/web: cel `object.status.missing > 1` failed:"
        ' Key not found in map : "missing"'
    ]
    dyn = check({"cel": "object.spec.replicas"})
    assert failures(dyn, deployment())[0].endswith("gave 3, not a bool")


def test_a_runaway_cel_comprehension_is_stopped_by_the_iteration_budget() -> None:
    c = check({"cel": "object.data.l.all(x, object.data.l.all(y, x != y || x == y))"})
    obj = configmap() | {"data": {"l": list(range(1000))}}
    assert failures(c, obj)[0].endswith("failed: Iteration budget exceeded")


def test_huge_or_deep_objects_are_not_handed_to_cel() -> None:
    c = check({"cel": "has(object.data)"})
    assert (
        "not evaluated: object is larger than 256 KiB" in failures(c, configmap(v="x" * 300_000))[0]
    )
    deep: dict[str, Any] = {}
    for _ in range(50_000):
        deep = {"a": deep}
    nested = configmap() | {"data": deep}
    assert "not evaluated: object nests deeper than 100 levels" in failures(c, nested)[0]


def test_managed_fields_do_not_count_against_the_cel_size_limit() -> None:
    obj = deployment()
    obj["metadata"]["managedFields"] = [{"manager": "x" * 300_000}]
    assert failures(check({"cel": "!has(object.metadata.managedFields)"}), obj) == []


def test_broken_objects_fail_rather_than_raise() -> None:
    broken = {"kind": "Thing", "metadata": {"name": "t"}, "status": {"conditions": 7}}
    c = check({"condition": {"type": "Ready"}}, {"field": {"path": ".status.x", "equals": 1}})
    assert failures(c, broken, {"kind": "Thing", "metadata": {"name": "u"}, "status": "up"}) == [
        "check c: Thing t: condition Ready is missing (want True)",
        "check c: Thing t: field .status.x is missing (want 1)",
        "check c: Thing u: condition Ready is missing (want True)",
        "check c: Thing u: field .status.x is unreachable: .status is a string, not an object"
        " (want 1)",
    ]


def test_text_that_is_not_utf8_is_a_problem_or_a_failure() -> None:
    lone = "\ud800"
    _, problems = hc.parse([{"assertions": [{"cel": f"object.data.v == '{lone}'"}]}])
    assert problems == [
        "spec.healthChecks[0].assertions[0]: cel: holds characters that are not valid UTF-8"
    ]
    c = check({"cel": "object.data.v == 'a'"}, {"field": {"path": ".data.v", "matches": "a"}})
    assert len(failures(c, configmap(v=lone))) == 2
    assert hc.message(Health(False, lone)) == "?"


def test_a_probe_past_its_timeout_stops_and_fails() -> None:
    ticks = iter(range(100))
    c = one({"name": "slow", "timeoutSeconds": 2})
    result = hc.evaluate(c, [configmap(str(i)) for i in range(5)], clock=lambda: next(ticks))
    assert result.failures == ("check slow: probe timed out after 2s (3 objects not checked)",)


# --- probing over time ---------------------------------------------------------------------

EQUALS_ON = {"field": {"path": ".data.state", "equals": "on"}}
Objects = list[dict[str, Any]]
ON: Objects = [configmap(state="on")]
OFF: Objects = [configmap(state="off")]


def probes(c: hc.Check, seen: Sequence[Objects], times: Sequence[float]) -> list[bool | None]:
    """The verdict after each step at ``times``, seeing ``seen[i]`` at step i."""
    state: dict[str, hc.ProbeState] = {}
    verdicts = []
    for objects, now in zip(seen, times, strict=True):
        hc.step([c], state, objects, now=now, installed_at=0)
        verdicts.append(state[c.name].verdict)
    return verdicts


def test_no_probe_runs_before_the_initial_delay() -> None:
    c = one({"name": "c", "initialDelaySeconds": 30, "assertions": [EQUALS_ON]})
    state: dict[str, hc.ProbeState] = {}
    health, wait = hc.step([c], state, ON, now=100, installed_at=80)
    assert (health, wait) == (Health(False, "check c: waiting 10s for the initial delay"), 10)
    assert state["c"].last_probe is None
    hc.step([c], state, ON, now=110, installed_at=80)
    assert state["c"].last_probe == 110


@pytest.mark.parametrize(
    ("thresholds", "seen", "verdicts"),
    [
        pytest.param(
            {"failureThreshold": 3},
            [ON, OFF, OFF, ON, OFF, OFF, OFF],
            [True, True, True, True, True, True, False],
            id="failing takes failureThreshold consecutive failures",
        ),
        pytest.param(
            {"successThreshold": 2, "failureThreshold": 1},
            [ON, OFF, ON, ON, OFF],
            [None, False, False, True, False],
            id="passing takes successThreshold consecutive successes",
        ),
    ],
)
def test_a_verdict_changes_after_its_threshold_of_consecutive_probes(
    thresholds: dict[str, int], seen: list[Objects], verdicts: list[bool | None]
) -> None:
    c = one({"name": "c", **thresholds, "assertions": [EQUALS_ON]})
    assert probes(c, seen, [10 * step for step in range(len(seen))]) == verdicts


def test_a_failing_check_that_passes_again_says_it_is_recovering() -> None:
    c = one({"name": "c", "successThreshold": 2, "failureThreshold": 1, "assertions": [EQUALS_ON]})
    state: dict[str, hc.ProbeState] = {}
    hc.step([c], state, OFF, now=0, installed_at=0)
    health, _ = hc.step([c], state, ON, now=10, installed_at=0)
    assert health == Health(False, "check c: recovering, 1 of 2 successes")


def test_probes_are_spaced_by_the_period_and_the_wait_says_when_the_next_is_due() -> None:
    c = one({"name": "c", "periodSeconds": 10, "assertions": [EQUALS_ON]})
    state: dict[str, hc.ProbeState] = {}
    assert hc.step([c], state, ON, now=0, installed_at=0) == (Health(True), 10)
    assert hc.step([c], state, OFF, now=4, installed_at=0)[1] == 6
    assert (state["c"].last_probe, state["c"].failures) == (0, 0)
    assert hc.step([c], state, OFF, now=10.5, installed_at=0)[1] == 10
    assert (state["c"].last_probe, state["c"].failures) == (10.5, 1)


def test_the_wait_is_the_soonest_of_all_checks_and_none_without_checks() -> None:
    fast = one({"name": "fast", "periodSeconds": 3})
    slow = one({"name": "slow", "periodSeconds": 30, "initialDelaySeconds": 1})
    assert hc.step([slow, fast], {}, ON, now=0, installed_at=0)[1] == 1
    assert hc.step([], {}, ON, now=0, installed_at=0) == (Health(True), None)


def test_ready_only_when_every_check_passes() -> None:
    on = one({"name": "on", "assertions": [EQUALS_ON], "failureThreshold": 1})
    exists = one({"name": "exists", "selector": {"kind": "ConfigMap"}})
    state: dict[str, hc.ProbeState] = {}
    assert hc.step([on, exists], state, ON, now=0, installed_at=0)[0] == Health(True)
    health, _ = hc.step([on, exists], state, OFF, now=10, installed_at=0)
    assert health == Health(
        False, 'check on: ConfigMap ns/settings: field .data.state is "off" (want "on")'
    )


def test_the_state_of_a_removed_check_is_dropped() -> None:
    state = {"old": hc.ProbeState(verdict=False)}
    hc.step([one({"name": "new"})], state, ON, now=0, installed_at=0)
    assert list(state) == ["new"]


# --- messages ------------------------------------------------------------------------------


def test_the_reason_names_the_first_failure_and_counts_the_rest() -> None:
    c = one({"name": "c", "failureThreshold": 1, "assertions": [EQUALS_ON]})
    objects = [configmap(str(i), state="off") for i in range(40)]
    health, _ = hc.step([c], {}, objects, now=0, installed_at=0)
    assert health.reason == (
        'check c: ConfigMap ns/0: field .data.state is "off" (want "on") (and 39 more)'
    )


def test_a_long_reason_keeps_its_count_within_a_kib() -> None:
    c = one({"name": "c", "failureThreshold": 1, "assertions": [EQUALS_ON]})
    objects = [configmap("n" * 3000 + str(i)) for i in range(3)]
    health, _ = hc.step([c], {}, objects, now=0, installed_at=0)
    assert len(health.reason.encode()) <= 1024
    assert health.reason.endswith(" (and 2 more)")


def test_the_message_is_cut_to_the_limit_in_bytes() -> None:
    assert hc.message(Health(False, "short")) == "short"
    cut = hc.message(Health(False, "é" * 1000), limit=100)
    assert len(cut.encode()) <= 100
    assert cut.endswith("…")
    assert hc.message(Health(False, "x" * 5000)) == "x" * 1021 + "…"
