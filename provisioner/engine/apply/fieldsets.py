"""``fieldsV1`` sets read as their leaves: the one walk of server-side apply's ownership format.

Sits under ``ignore`` (which turns each leaf into a JSON pointer into the object, to meet
ignore rules) and ``restore`` (which names each leaf, as ``spec.containers[name=web]``, in
the message a fight gets). A ``fieldsV1`` set is a tree of keys: ``f:<name>`` a map's
field, ``k:<json>`` a list entry named by its keys, ``v:<json>`` one named by its value,
``i:<n>`` one named by its place; ``.`` marks a node that is itself owned. A leaf is a key
with no children but ``.`` (a non-map child counts as one).

Pure: no client, no clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple


class Key(NamedTuple):
    kind: str
    """``f``, ``k``, ``v`` or ``i``."""
    text: str
    """What follows the colon: a field name, or the JSON of a list entry's key or value."""
    raw: str
    """The key as the set spells it."""


def leaves(fields_v1: Any) -> Iterator[tuple[Key, ...]]:
    """The path of keys to each leaf of the set, in the set's order; nothing for a set
    that is not a map, or names no field."""
    if isinstance(fields_v1, dict):
        yield from _leaves(fields_v1, ())


def _leaves(node: dict[str, Any], path: tuple[Key, ...]) -> Iterator[tuple[Key, ...]]:
    children = {k: v for k, v in node.items() if k != "."}
    if not children:
        if path:
            yield path
        return
    for raw, child in children.items():
        kind, _, text = raw.partition(":")
        yield from _leaves(child if isinstance(child, dict) else {}, (*path, Key(kind, text, raw)))
