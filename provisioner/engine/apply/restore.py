"""Restoring drift without the bundle: our fields, taken from the last good observation.

Sits beside ``drift`` and ``appliedrecord``. A watcher that cached an object while it
still carried exactly the fields we applied (its ``managedFields`` entry for the
``rukpak`` manager matched the record) holds everything needed to undo a later change:
the values at those fields. ``ours`` projects an object onto a ``fieldsV1`` set (the
format server-side apply records ownership in), giving the body of an apply that sets
exactly those fields again and claims nothing else. Re-applied with ``force``, it takes
the fields back, and our field set (so the record's hash) is what it was.

``fields_of``/``others_owning`` name what another writer took (``spec.replicas`` and
the manager that now owns it), for the message a fight gets; ``Damper`` decides when a
re-apply may happen again, so a writer that keeps changing a field we apply (an HPA on
``replicas``) meets exponential backoff, not a loop.

Pure: no client, no clock (callers pass ``now``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from provisioner.engine.apply import fieldsets
from provisioner.engine.objects import FIELD_MANAGER, Obj, meta_of
from rukpak.common.backoff import Backoff

_IDENTITY = ("apiVersion", "kind")


class Unprojectable(ValueError):
    """The object does not hold a value the field set names (it cannot be restored from)."""


def ours(last_good: Obj, fields_v1: Any) -> Obj:
    """The apply body that sets the fields of ``fields_v1`` to their values in ``last_good``.

    Identity (``apiVersion``, ``kind``, ``metadata.name``, ``metadata.namespace``) is always
    included; server-side apply lists none of it in ``managedFields``.
    """
    if not isinstance(fields_v1, dict):
        raise Unprojectable("no field set to restore")
    body = _project(last_good, fields_v1, "")
    if not isinstance(body, dict):
        raise Unprojectable("the object is not a map")
    for key in _IDENTITY:
        body[key] = last_good.get(key)
    meta = dict(meta_of(body))
    src = last_good.get("metadata") or {}
    for key in ("name", "namespace"):
        if src.get(key):
            meta[key] = src[key]
    body["metadata"] = meta
    return body


def _project(value: Any, node: dict[str, Any], path: str) -> Any:
    if not node:
        return value  # a leaf: the value is owned whole (a scalar, or an atomic map or list)
    children = {k: v for k, v in node.items() if k != "."}
    if not children:  # only "." : the map or list itself, none of its members
        return {} if isinstance(value, dict) else [] if isinstance(value, list) else value
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, child in children.items():
            if not key.startswith("f:"):
                raise Unprojectable(f"{path or '.'}: {key!r} names no field of a map")
            name = key[2:]
            if name not in value:
                raise Unprojectable(f"{_join(path, name)} is missing")
            out[name] = _project(value[name], child or {}, _join(path, name))
        return out
    if isinstance(value, list):
        return _project_list(value, children, path)
    raise Unprojectable(f"{path or '.'}: a scalar where the field set has members")


def _project_list(items: list[Any], children: dict[str, Any], path: str) -> list[Any]:
    out: list[Any] = []
    for index, item in enumerate(items):
        for key, child in children.items():
            if _matches(key, item, index):
                # an entry's key fields are in the set when we sent them (we always do)
                out.append(_project(item, child or {}, f"{path}[{index}]"))
                break
    wanted = sum(1 for key in children if key[:2] in ("k:", "v:", "i:"))
    if len(out) != wanted:
        raise Unprojectable(f"{path or '.'}: {wanted - len(out)} list entries are missing")
    return out


def _matches(key: str, item: Any, index: int) -> bool:
    kind, _, text = key.partition(":")
    if kind == "i":
        return text == str(index)
    try:
        wanted = json.loads(text)
    except ValueError:
        return False
    if kind == "v":
        return bool(item == wanted)
    if kind == "k":
        return isinstance(item, dict) and all(item.get(k) == v for k, v in wanted.items())
    return False


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


# -- naming what another writer took -------------------------------------------------------


def fields_of(fields_v1: Any) -> Iterator[str]:
    """The leaf paths a ``fieldsV1`` set names, as ``spec.template.spec.containers[name=x]``."""
    for keys in fieldsets.leaves(fields_v1):
        path = ""
        for key in keys:
            if key.kind == "f":
                path = _join(path, key.text)
            elif key.kind == "k":
                try:
                    wanted = json.loads(key.text)
                except ValueError:
                    wanted = {}
                label = ",".join(f"{k}={v}" for k, v in sorted(wanted.items()))
                path = f"{path}[{label}]"
            else:
                path = f"{path}[{key.text}]"
        yield path


def others_owning(live: Obj | None, taken: frozenset[str]) -> list[tuple[str, str]]:
    """(manager, field) for each field of ``taken`` that another manager owns in ``live``."""
    if live is None:
        return []
    out: list[tuple[str, str]] = []
    for entry in meta_of(live).get("managedFields") or []:
        manager = str(entry.get("manager") or "?")
        if manager == FIELD_MANAGER and entry.get("operation") == "Apply":
            continue
        for path in fields_of(entry.get("fieldsV1")):
            if path in taken:
                out.append((manager, path))
    return sorted(set(out))


# -- damping a fight -----------------------------------------------------------------------


@dataclass
class Damper:
    """When a drifted object may be re-applied again: at once the first time, then with
    exponential backoff while the drift keeps coming back within ``window`` seconds.

    ``fights(key, now)`` counts the re-applies inside the window; a key quiet for a whole
    window starts afresh.
    """

    backoff: Backoff = field(default_factory=lambda: Backoff(base=1.0, cap=300.0))
    window: float = 600.0
    _history: dict[str, list[float]] = field(default_factory=dict, init=False, repr=False)

    def wait(self, key: str, now: float) -> float:
        """Seconds until ``key`` may be re-applied (0: now)."""
        recent = self._recent(key, now)
        if not recent:
            return 0.0
        delay = self.backoff.delay(len(recent) - 1)
        return max(0.0, recent[-1] + delay - now)

    def record(self, key: str, now: float) -> int:
        """Note a re-apply of ``key``; returns how many happened inside the window."""
        recent = self._recent(key, now)
        recent.append(now)
        self._history[key] = recent
        return len(recent)

    def fights(self, key: str, now: float) -> int:
        return len(self._recent(key, now))

    def drop(self, key: str) -> None:
        """Drop the history of ``key`` (a deleted BundleDeployment)."""
        self._history.pop(key, None)

    def forget(self, prefix: str) -> None:
        """Drop the history of every key starting with ``prefix`` (an uninstalled BD)."""
        for key in [k for k in self._history if k.startswith(prefix)]:
            del self._history[key]

    def _recent(self, key: str, now: float) -> list[float]:
        times = [t for t in self._history.get(key, ()) if now - t < self.window]
        if times:
            self._history[key] = times
        else:
            self._history.pop(key, None)
        return times
