"""Ignore rules: fields of installed objects another writer may own (``spec.ignore``).

Sits beside ``restore`` and ``ownership``, used by ``apply`` (an existing object is applied
without the ignored fields another writer owns, so that writer's value stays), by the
manager's drift judgement (``manager.runwatch``: a change only in ignored fields is not
drift, nothing is restored) and by the restore body (which never takes an ignored field
back). The shape follows Flux's HelmRelease ``driftDetection.ignore`` (JSON pointers plus
a target selector)::

    ignore:
    - paths: ["/spec/replicas"]
      target: {kind: Deployment, name: web}

A path is a JSON pointer (RFC 6901: ``/`` between tokens, ``~1`` for a ``/`` and ``~0``
for a ``~`` inside one); a rule with no target applies to every object. Server-side apply
records ownership as ``fieldsV1`` sets, whose list entries are named by key
(``k:{"name":"web"}``); ``owned_pointers`` turns such a set into pointers, list entries
numbered by their place in the object, so a pointer like ``/spec/containers/0/image``
meets them.

Pure: no client, no clock.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from provisioner.engine.apply import fieldsets
from provisioner.engine.apply.ownership import applied_fields, lost_reason
from provisioner.engine.objects import FIELD_MANAGER, OWNER_LABEL, Obj, meta_of, split_api_version
from rukpak.common import errors

Pointer = tuple[str, ...]
"""A parsed JSON pointer: its unescaped tokens (``()`` is the whole object)."""

_PROTECTED: tuple[Pointer, ...] = (
    ("apiVersion",),
    ("kind",),
    ("metadata", "name"),
    ("metadata", "namespace"),
    ("metadata", "labels", OWNER_LABEL),
    ("metadata", "annotations", "core.rukpak.io/applied-digest"),
)
"""What identifies an object as ours: never ignored (an ignore rule may not name these, nor
anything that holds them)."""


class InvalidRule(errors.InvalidArgument):
    """An ignore rule that cannot be honoured (a bad JSON pointer, a bad selector)."""


def parse_pointer(text: str) -> Pointer:
    """The tokens of JSON pointer ``text``; ``InvalidRule`` says what is wrong with it."""
    if not isinstance(text, str) or not text.startswith("/"):
        raise InvalidRule(f"{text!r} is not a JSON pointer: it must start with '/'")
    tokens: list[str] = []
    for raw in text[1:].split("/"):
        at = raw.find("~")
        while at != -1:
            if raw[at + 1 : at + 2] not in ("0", "1"):
                raise InvalidRule(
                    f"{text!r} is not a JSON pointer: '~' must be followed by 0 or 1 "
                    "(write ~0 for '~' and ~1 for '/')"
                )
            at = raw.find("~", at + 2)
        tokens.append(raw.replace("~1", "/").replace("~0", "~"))
    return tuple(tokens)


def format_pointer(pointer: Pointer) -> str:
    """``pointer`` written as a JSON pointer (the inverse of ``parse_pointer``)."""
    return "".join("/" + t.replace("~", "~0").replace("/", "~1") for t in pointer)


def covers(outer: Pointer, inner: Pointer) -> bool:
    """Whether ``inner`` is ``outer`` or lies under it."""
    return inner[: len(outer)] == outer


# -- rules and targets -----------------------------------------------------------------------


@dataclass(frozen=True)
class Selector:
    """An equality-based label selector: ``app=web,tier!=db,canary,!legacy``."""

    equal: tuple[tuple[str, str], ...] = ()
    unequal: tuple[tuple[str, str], ...] = ()
    present: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()

    @classmethod
    def parse(cls, text: str) -> Selector:
        equal: list[tuple[str, str]] = []
        unequal: list[tuple[str, str]] = []
        present: list[str] = []
        absent: list[str] = []
        for part in (p.strip() for p in text.split(",")):
            if not part:
                raise InvalidRule(f"label selector {text!r} has an empty requirement")
            if " in " in part or " notin " in part or "(" in part:
                raise InvalidRule(
                    f"label selector {text!r}: only key=value, key!=value, key and !key "
                    "requirements are supported"
                )
            if "!=" in part:
                key, _, value = part.partition("!=")
                unequal.append((_label_key(key, text), value.strip()))
            elif "=" in part:
                key, _, value = part.partition("==" if "==" in part else "=")
                equal.append((_label_key(key, text), value.strip()))
            elif part.startswith("!"):
                absent.append(_label_key(part[1:], text))
            else:
                present.append(_label_key(part, text))
        return cls(tuple(equal), tuple(unequal), tuple(present), tuple(absent))

    def matches(self, labels: Mapping[str, Any]) -> bool:
        return (
            all(str(labels.get(k)) == v and k in labels for k, v in self.equal)
            and all(str(labels.get(k)) != v or k not in labels for k, v in self.unequal)
            and all(k in labels for k in self.present)
            and all(k not in labels for k in self.absent)
        )


def _label_key(key: str, text: str) -> str:
    key = key.strip()
    if not key or any(c.isspace() for c in key):
        raise InvalidRule(f"label selector {text!r} has a malformed key {key!r}")
    return key


@dataclass(frozen=True)
class Target:
    """Which objects a rule is for; an empty field matches anything."""

    group: str = ""
    version: str = ""
    kind: str = ""
    name: str = ""
    namespace: str = ""
    selector: Selector | None = None

    def matches(self, obj: Obj) -> bool:
        group, version = split_api_version(str(obj.get("apiVersion") or ""))
        meta = meta_of(obj)
        wanted = (
            (self.group, group),
            (self.version, version),
            (self.kind, str(obj.get("kind") or "")),
            (self.name, str(meta.get("name") or "")),
            (self.namespace, str(meta.get("namespace") or "")),
        )
        if any(want and want != have for want, have in wanted):
            return False
        return self.selector is None or self.selector.matches(meta.get("labels") or {})


@dataclass(frozen=True)
class Rule:
    paths: tuple[Pointer, ...]
    target: Target = field(default_factory=Target)


def parse_rules(spec_ignore: Any) -> tuple[Rule, ...]:
    """The rules of a BundleDeployment's ``spec.ignore``; ``InvalidRule`` names the first
    wrong one (``spec.ignore[1].paths[0]: ...``). Absent or empty: no rules."""
    if spec_ignore in (None, []):
        return ()
    if not isinstance(spec_ignore, list):
        raise InvalidRule("spec.ignore must be a list of {paths, target} rules")
    rules: list[Rule] = []
    for index, raw in enumerate(spec_ignore):
        where = f"spec.ignore[{index}]"
        if not isinstance(raw, dict):
            raise InvalidRule(f"{where} must be a map with paths and an optional target")
        paths = raw.get("paths")
        if not isinstance(paths, list) or not paths:
            raise InvalidRule(f"{where}.paths must list at least one JSON pointer")
        pointers: list[Pointer] = []
        for at, text in enumerate(paths):
            try:
                pointer = parse_pointer(text)
            except InvalidRule as err:
                raise InvalidRule(f"{where}.paths[{at}]: {err.message}") from None
            if any(covers(pointer, p) for p in _PROTECTED):
                raise InvalidRule(
                    f"{where}.paths[{at}]: {text!r} would ignore what identifies the object "
                    "as installed by this BundleDeployment; name a field below it"
                )
            pointers.append(pointer)
        rules.append(Rule(tuple(pointers), _target(raw.get("target"), where)))
    return tuple(rules)


def _target(raw: Any, where: str) -> Target:
    if raw is None:
        return Target()
    if not isinstance(raw, dict):
        raise InvalidRule(f"{where}.target must be a map")
    texts = {
        key: str(raw.get(key) or "") for key in ("group", "version", "kind", "name", "namespace")
    }
    selector_text = raw.get("labelSelector")
    selector = None
    if selector_text:
        try:
            selector = Selector.parse(str(selector_text))
        except InvalidRule as err:
            raise InvalidRule(f"{where}.target.labelSelector: {err.message}") from None
    return Target(selector=selector, **texts)


def pointers_for(rules: Iterable[Rule], obj: Obj) -> tuple[Pointer, ...]:
    """The ignored pointers of ``obj``: the paths of every rule whose target it matches."""
    out: list[Pointer] = []
    for rule in rules:
        if rule.target.matches(obj):
            out += [p for p in rule.paths if p not in out]
    return tuple(out)


def ignored(pointers: Iterable[Pointer], path: Pointer) -> bool:
    """Whether field ``path`` lies under one of ``pointers``."""
    return any(covers(p, path) for p in pointers)


# -- fieldsV1 as pointers --------------------------------------------------------------------


def owned_pointers(fields_v1: Any, obj: Obj | None) -> frozenset[Pointer]:
    """The leaf fields of ``fieldsV1`` set as pointers into ``obj`` (list entries named by
    key or value become their index in ``obj``; one not found keeps its raw key)."""
    return frozenset(_pointer(keys, obj) for keys in fieldsets.leaves(fields_v1))


def _pointer(keys: tuple[fieldsets.Key, ...], value: Any) -> Pointer:
    tokens: list[str] = []
    for key in keys:
        if key.kind == "f":
            value = value.get(key.text) if isinstance(value, dict) else None
            tokens.append(key.text)
        else:
            index = _index(key.kind, key.text, value)
            value = value[index] if index is not None and isinstance(value, list) else None
            tokens.append(str(index) if index is not None else key.raw)
    return tuple(tokens)


def _index(kind: str, text: str, items: Any) -> int | None:
    if not isinstance(items, list):
        return None
    if kind == "i":
        return int(text) if text.isdigit() and int(text) < len(items) else None
    try:
        wanted = json.loads(text)
    except ValueError:
        return None
    for at, item in enumerate(items):
        if kind == "v" and item == wanted:
            return at
        if (
            kind == "k"
            and isinstance(wanted, dict)
            and isinstance(item, dict)
            and all(item.get(k) == v for k, v in wanted.items())
        ):
            return at
    return None


def others_own(live: Obj, pointer: Pointer) -> list[str]:
    """Field managers other than ours that own ``pointer``, something under it, or a whole
    value holding it, in ``live``."""
    out: list[str] = []
    for entry in meta_of(live).get("managedFields") or []:
        manager = str(entry.get("manager") or "?")
        if manager == FIELD_MANAGER and entry.get("operation") == "Apply":
            continue
        if entry.get("subresource"):
            continue
        for owned in owned_pointers(entry.get("fieldsV1"), live):
            if covers(pointer, owned) or covers(owned, pointer):
                out.append(manager)
                break
    return sorted(set(out))


def only_ignored(
    fields_then: Any, then: Obj | None, *, live: Obj | None, owner: str, rules: Iterable[Rule]
) -> bool:
    """Whether the only change from our field set ``fields_then`` (of object ``then``) to
    ``live``'s is in fields ``rules`` ignore for this object (another writer took them):
    then it has not drifted. False when it is gone or no longer ``owner``'s."""
    if then is None or live is None or lost_reason(live, owner) is not None:
        return False
    pointers = pointers_for(rules, live)
    if not pointers:
        return False
    changed = owned_pointers(fields_then, then) ^ owned_pointers(applied_fields(live), live)
    return bool(changed) and all(ignored(pointers, p) for p in changed)


# -- shaping an apply body -------------------------------------------------------------------


_MISSING = object()


def get(obj: Any, pointer: Pointer) -> Any:
    """The value at ``pointer`` in ``obj``; ``_MISSING`` when there is none."""
    here = obj
    for token in pointer:
        if isinstance(here, dict) and token in here:
            here = here[token]
        elif isinstance(here, list) and token.isdigit() and int(token) < len(here):
            here = here[int(token)]
        else:
            return _MISSING
    return here


def has(obj: Any, pointer: Pointer) -> bool:
    return get(obj, pointer) is not _MISSING


def _set(obj: Any, pointer: Pointer, value: Any) -> Any:
    """A copy of ``obj`` with ``value`` at ``pointer`` (the parents must exist)."""
    if not pointer:
        return value
    head, rest = pointer[0], pointer[1:]
    if isinstance(obj, dict) and head in obj:
        return {**obj, head: _set(obj[head], rest, value)}
    if isinstance(obj, list) and head.isdigit() and int(head) < len(obj):
        out = list(obj)
        out[int(head)] = _set(obj[int(head)], rest, value)
        return out
    return obj


def _drop(obj: Any, pointer: Pointer) -> Any:
    """A copy of ``obj`` without what ``pointer`` names (unchanged when it is absent)."""
    if not pointer:
        return obj
    head, rest = pointer[0], pointer[1:]
    if isinstance(obj, dict) and head in obj:
        if not rest:
            return {k: v for k, v in obj.items() if k != head}
        return {**obj, head: _drop(obj[head], rest)}
    if isinstance(obj, list) and head.isdigit() and int(head) < len(obj):
        at = int(head)
        if not rest:
            return obj[:at] + obj[at + 1 :]
        out = list(obj)
        out[at] = _drop(obj[at], rest)
        return out
    return obj


def shape(body: Obj, live: Obj | None, *, pointers: Iterable[Pointer]) -> Obj:
    """``body`` as applied to an object that exists as ``live``, honouring ``pointers``.

    Creation (``live`` None) sends everything: the bundle's values are the first ones.
    Afterwards an ignored field another writer owns is left out, so its value stays; one
    nobody else owns keeps the live value (leaving it out would make server-side apply
    remove it, ours being its only owner); one the live object lacks is left out.
    """
    if live is None:
        return body
    out: Any = body
    for pointer in pointers:
        if not has(out, pointer):
            continue
        now = get(live, pointer)
        if now is _MISSING or others_own(live, pointer):
            out = _drop(out, pointer)
        else:
            out = _set(out, pointer, now)
    result: Obj = out
    return result
