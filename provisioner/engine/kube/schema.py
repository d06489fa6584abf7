"""A focused OpenAPI v3 validator for CRD schemas (the subset CRD upgrades need).

Used by ``crdsafety`` to check existing custom resources against a CRD's new
``openAPIV3Schema`` before the new CRD is applied. It covers what structural
schemas use most: type (with nullable, x-kubernetes-int-or-string), required,
enum, properties, items, additionalProperties, minimum/maximum (and exclusive),
minLength/maxLength, minItems/maxItems, minProperties/maxProperties, pattern,
and allOf/anyOf/oneOf/not. Besides violations it reports fields the new schema
would prune (not declared, no additionalProperties, no
x-kubernetes-preserve-unknown-fields), because pruning silently loses data.
Paths read like ``.spec.replicas`` or ``.spec.ports[2].name``.
"""

from __future__ import annotations

import re
from collections.abc import Sized
from dataclasses import dataclass
from typing import Any

Schema = dict[str, Any]

ROOT_META = frozenset({"apiVersion", "kind", "metadata"})


@dataclass(frozen=True)
class Violation:
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path or '.'}: {self.message}"


_JSON_TYPES: tuple[tuple[type, str], ...] = (
    (bool, "boolean"),  # before int: a bool is an int in Python
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    (list, "array"),
    (dict, "object"),
)


def _type_of(value: Any) -> str:
    """The OpenAPI type name of a decoded JSON value."""
    if value is None:
        return "null"
    return next((name for t, name in _JSON_TYPES if isinstance(value, t)), type(value).__name__)


def _type_ok(value: Any, schema: Schema) -> bool:
    want = schema.get("type")
    got = _type_of(value)
    if schema.get("x-kubernetes-int-or-string"):
        return got in ("integer", "string") or (got == "null" and bool(schema.get("nullable")))
    if got == "null":
        return bool(schema.get("nullable")) or want is None
    if want is None or want == got:
        return True
    return want == "number" and got == "integer"


def validate(value: Any, schema: Schema, *, root: bool = False) -> list[Violation]:
    """All violations of ``schema`` by ``value``; ``root`` skips apiVersion/kind/metadata."""
    out: list[Violation] = []
    _validate(value, schema, "", out, root=root)
    return out


def _validate(value: Any, schema: Schema, path: str, out: list[Violation], *, root: bool) -> None:
    if not _type_ok(value, schema):
        want = schema.get("type") or "integer or string"
        out.append(Violation(path, f"must be of type {want}, is {_type_of(value)}"))
        return
    if value is None:
        return
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(repr(v) for v in schema["enum"])
        out.append(Violation(path, f"{value!r} is not one of {allowed}"))
    _bounds(value, schema, path, out)
    _combinators(value, schema, path, out, root=root)
    if isinstance(value, dict):
        _object(value, schema, path, out, root=root)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            _validate(item, schema["items"], f"{path}[{i}]", out, root=False)


def _bounds(value: Any, schema: Schema, path: str, out: list[Violation]) -> None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        low, high = schema.get("minimum"), schema.get("maximum")
        if low is not None:
            if schema.get("exclusiveMinimum") and value <= low:
                out.append(Violation(path, f"{value} must be greater than {low}"))
            elif value < low:
                out.append(Violation(path, f"{value} is less than the minimum {low}"))
        if high is not None:
            if schema.get("exclusiveMaximum") and value >= high:
                out.append(Violation(path, f"{value} must be less than {high}"))
            elif value > high:
                out.append(Violation(path, f"{value} is greater than the maximum {high}"))
    sized: list[tuple[type[Sized], str, str, str]] = [
        (str, "minLength", "maxLength", "characters"),
        (list, "minItems", "maxItems", "items"),
        (dict, "minProperties", "maxProperties", "properties"),
    ]
    for kind, low_key, high_key, unit in sized:
        if isinstance(value, kind):
            n = len(value)
            if low_key in schema and n < schema[low_key]:
                out.append(
                    Violation(path, f"has {n} {unit}, fewer than {low_key} {schema[low_key]}")
                )
            if high_key in schema and n > schema[high_key]:
                out.append(
                    Violation(path, f"has {n} {unit}, more than {high_key} {schema[high_key]}")
                )
    if isinstance(value, str) and "pattern" in schema:
        try:
            matched = re.search(schema["pattern"], value) is not None
        except re.error:
            matched = True  # a pattern Python cannot read is not ours to judge
        if not matched:
            out.append(Violation(path, f"{value!r} does not match pattern {schema['pattern']!r}"))


def _combinators(
    value: Any, schema: Schema, path: str, out: list[Violation], *, root: bool
) -> None:
    for sub in schema.get("allOf") or []:
        _validate(value, _without_structure(sub), path, out, root=root)
    any_of = schema.get("anyOf") or []
    if any_of and all(validate(value, _without_structure(s)) for s in any_of):
        out.append(Violation(path, "matches none of the anyOf schemas"))
    if schema.get("oneOf"):
        n = sum(1 for s in schema["oneOf"] if not validate(value, _without_structure(s)))
        if n != 1:
            out.append(Violation(path, f"matches {n} of the oneOf schemas, must match exactly 1"))
    if isinstance(schema.get("not"), dict) and not validate(
        value, _without_structure(schema["not"])
    ):
        out.append(Violation(path, "matches the schema under not"))


def _without_structure(schema: Schema) -> Schema:
    """Value validations inside combinators may not declare structure; never prune there."""
    return {**schema, "x-kubernetes-preserve-unknown-fields": True}


def _object(
    value: dict[str, Any], schema: Schema, path: str, out: list[Violation], *, root: bool
) -> None:
    props: dict[str, Schema] = schema.get("properties") or {}
    for name in schema.get("required") or []:
        if name not in value:
            out.append(Violation(f"{path}.{name}", "is required"))
    additional = schema.get("additionalProperties")
    preserve = bool(schema.get("x-kubernetes-preserve-unknown-fields"))
    for key, item in value.items():
        sub_path = f"{path}.{key}"
        if root and key in ROOT_META:
            continue
        if key in props:
            _validate(item, props[key], sub_path, out, root=False)
        elif isinstance(additional, dict):
            _validate(item, additional, sub_path, out, root=False)
        elif additional is False:
            out.append(Violation(sub_path, "is not allowed (additionalProperties: false)"))
        elif additional is True or preserve or (not props and schema.get("type") != "object"):
            continue
        else:
            out.append(Violation(sub_path, "is not in the new schema and would be pruned"))
