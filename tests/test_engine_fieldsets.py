"""``fieldsV1`` sets read as leaves (``provisioner.engine.apply.fieldsets``), pure: the walk
``ignore.owned_pointers`` and ``restore.fields_of`` share."""

from __future__ import annotations

from typing import Any

import pytest

from provisioner.engine.apply import fieldsets

FIELDS = {
    "f:metadata": {"f:labels": {"f:app": {}}},
    "f:spec": {
        "f:replicas": {},
        "f:template": {
            "f:spec": {
                "f:containers": {
                    'k:{"name":"web"}': {".": {}, "f:image": {}},
                },
            },
        },
    },
}


def test_each_leaf_is_the_path_of_its_keys_in_the_sets_order() -> None:
    paths = [[k.raw for k in keys] for keys in fieldsets.leaves(FIELDS)]
    assert paths == [
        ["f:metadata", "f:labels", "f:app"],
        ["f:spec", "f:replicas"],
        ["f:spec", "f:template", "f:spec", "f:containers", 'k:{"name":"web"}', "f:image"],
    ]
    *_, entry, image = next(keys for keys in fieldsets.leaves(FIELDS) if len(keys) == 6)
    assert (entry.kind, entry.text) == ("k", '{"name":"web"}')
    assert (image.kind, image.text) == ("f", "image")


def test_a_node_owned_itself_with_no_children_is_a_leaf() -> None:
    assert [[k.raw for k in keys] for keys in fieldsets.leaves({"f:data": {".": {}}})] == [
        ["f:data"]
    ]


@pytest.mark.parametrize("broken", [None, [], "f:spec", {}, {".": {}}], ids=repr)
def test_a_set_that_is_not_a_map_or_names_no_field_has_no_leaves(broken: Any) -> None:
    assert list(fieldsets.leaves(broken)) == []


def test_a_child_that_is_not_a_map_counts_as_a_leaf() -> None:
    assert [[k.raw for k in keys] for keys in fieldsets.leaves({"f:spec": "x"})] == [["f:spec"]]
