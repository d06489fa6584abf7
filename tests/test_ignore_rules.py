"""Ignore rules (``provisioner.engine.apply.ignore``), pure: JSON pointers with their escapes and
the pointers that are refused, rules and their targets, ``fieldsV1`` sets read as pointers,
and the apply body shaped for an object that exists."""

from __future__ import annotations

from typing import Any

import pytest

from provisioner.engine.apply import ignore
from provisioner.engine.objects import FIELD_MANAGER
from provisioner.instance import process

# -- JSON pointers --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("/spec/replicas", ("spec", "replicas")),
        (
            "/metadata/annotations/example.com~1owner",
            ("metadata", "annotations", "example.com/owner"),
        ),
        ("/data/a~0b", ("data", "a~b")),
        ("/data/~01", ("data", "~1")),  # ~0 first: "~01" is "~" then "1", not "/"
        ("/spec/containers/0/image", ("spec", "containers", "0", "image")),
        ("/data/", ("data", "")),
    ],
)
def test_a_pointer_reads_its_tokens_with_the_escapes_undone(
    text: str, tokens: tuple[str, ...]
) -> None:
    assert ignore.parse_pointer(text) == tokens
    assert ignore.format_pointer(tokens) == text


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("spec/replicas", "must start with '/'"),
        ("", "must start with '/'"),
        ("/data/a~2", "'~' must be followed by 0 or 1"),
        ("/data/a~", "'~' must be followed by 0 or 1"),
    ],
)
def test_a_bad_pointer_is_refused_saying_why(text: str, says: str) -> None:
    with pytest.raises(ignore.InvalidRule, match=says):
        ignore.parse_pointer(text)


def test_a_bad_rule_names_where_it_is_in_the_spec() -> None:
    with pytest.raises(ignore.InvalidRule, match=r"spec.ignore\[1\].paths\[0\]: 'spec' is not"):
        ignore.parse_rules([{"paths": ["/a"]}, {"paths": ["spec"]}])
    with pytest.raises(ignore.InvalidRule, match=r"spec.ignore\[0\].paths must list"):
        ignore.parse_rules([{"paths": []}])
    with pytest.raises(ignore.InvalidRule, match=r"labelSelector: .*only key=value"):
        ignore.parse_rules([{"paths": ["/a"], "target": {"labelSelector": "a in (b)"}}])


@pytest.mark.parametrize(
    "path",
    ["/metadata", "/metadata/labels", "/metadata/labels/core.rukpak.io~1owner-name", "/kind"],
)
def test_what_identifies_an_object_as_ours_cannot_be_ignored(path: str) -> None:
    with pytest.raises(ignore.InvalidRule, match="identifies the object"):
        ignore.parse_rules([{"paths": [path]}])


def test_no_rules_is_fine() -> None:
    assert ignore.parse_rules(None) == ()
    assert ignore.parse_rules([]) == ()


# -- targets --------------------------------------------------------------------------------


def cm(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "demo", "labels": labels},
        "data": {"mode": "a", "keep": "b"},
    }


def test_a_target_picks_objects_by_kind_name_and_labels() -> None:
    rules = ignore.parse_rules(
        [
            {"paths": ["/data/mode"], "target": {"kind": "ConfigMap", "name": "one"}},
            {"paths": ["/data/keep"], "target": {"labelSelector": "tier=web,!legacy"}},
        ]
    )
    assert ignore.pointers_for(rules, cm("one")) == (("data", "mode"),)
    assert ignore.pointers_for(rules, cm("two", tier="web")) == (("data", "keep"),)
    assert ignore.pointers_for(rules, cm("two", tier="web", legacy="y")) == ()
    assert ignore.pointers_for(rules, {**cm("one"), "kind": "Secret"}) == ()
    everywhere = ignore.parse_rules([{"paths": ["/data"]}])
    assert ignore.pointers_for(everywhere, cm("any")) == (("data",),)


def test_a_group_and_version_target_read_the_api_version() -> None:
    rules = ignore.parse_rules([{"paths": ["/spec/replicas"], "target": {"group": "apps"}}])
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "w"}}
    assert ignore.pointers_for(rules, deployment) == (("spec", "replicas"),)
    assert ignore.pointers_for(rules, cm("x")) == ()


# -- fieldsV1 as pointers -------------------------------------------------------------------

POD_SPEC = {
    "spec": {"containers": [{"name": "side", "image": "s:1"}, {"name": "web", "image": "w:1"}]}
}


def test_list_entries_of_a_field_set_become_their_index_in_the_object() -> None:
    fields: dict[str, Any] = {
        "f:spec": {"f:containers": {'k:{"name":"web"}': {".": {}, "f:image": {}, "f:name": {}}}}
    }
    owned = ignore.owned_pointers(fields, POD_SPEC)
    assert owned == {("spec", "containers", "1", "image"), ("spec", "containers", "1", "name")}
    assert ignore.ignored(
        [ignore.parse_pointer("/spec/containers/1")], ("spec", "containers", "1", "image")
    )
    assert not ignore.ignored([("spec", "containers", "0")], ("spec", "containers", "1", "image"))


# -- shaping the apply body -----------------------------------------------------------------


def live_cm(*owners: tuple[str, str, dict[str, Any]]) -> dict[str, Any]:
    obj = cm("one")
    obj["data"] = {"mode": "theirs", "keep": "b"}
    obj["metadata"]["managedFields"] = [
        {"manager": m, "operation": op, "fieldsV1": f} for m, op, f in owners
    ]
    return obj


def test_creation_sends_the_ignored_fields() -> None:
    body = cm("one")
    assert ignore.shape(body, None, pointers=[("data", "mode")]) == body


def test_a_field_another_writer_owns_is_left_out_of_the_apply() -> None:
    live = live_cm(
        (FIELD_MANAGER, "Apply", {"f:data": {"f:keep": {}}}),
        ("kubectl-edit", "Update", {"f:data": {"f:mode": {}}}),
    )
    shaped = ignore.shape(cm("one"), live, pointers=[("data", "mode")])
    assert shaped["data"] == {"keep": "b"}
    assert cm("one")["data"]["mode"] == "a"  # the body given is not changed


def test_a_field_only_we_own_keeps_its_live_value_rather_than_vanish() -> None:
    live = live_cm((FIELD_MANAGER, "Apply", {"f:data": {"f:keep": {}, "f:mode": {}}}))
    assert ignore.shape(cm("one"), live, pointers=[("data", "mode")])["data"] == {
        "mode": "theirs",
        "keep": "b",
    }


def test_a_field_the_live_object_lacks_is_left_out() -> None:
    live = live_cm()
    del live["data"]["mode"]
    assert ignore.shape(cm("one"), live, pointers=[("data", "mode")])["data"] == {"keep": "b"}


# -- the instance's --ignore ----------------------------------------------------------------


def test_the_instance_reads_its_rules_from_json_and_refuses_what_is_not() -> None:
    assert process.ignore_rules("") == ()
    (rule,) = process.ignore_rules('[{"paths":["/spec/replicas"],"target":{"kind":"Deployment"}}]')
    assert rule.paths == (("spec", "replicas"),) and rule.target.kind == "Deployment"
    with pytest.raises(ignore.InvalidRule, match="--ignore is not JSON"):
        process.ignore_rules("[{")
    with pytest.raises(ignore.InvalidRule, match=r"spec.ignore\[0\].paths\[0\]"):
        process.ignore_rules('[{"paths":["/a~9"]}]')
