"""What the ``rukpak`` field manager owns on a live object, and whether applying would change it.

Pure, and shared by the two places that decide whether to write: ``apply``
(skip an object whose re-apply would be a no-op, so a re-install of unchanged
content sends no write requests) and ``drift`` (re-apply an object another
writer changed).

Both start from ``lost_reason`` (the object is gone, being deleted, or no
longer labelled as ours) and from our entry in ``managedFields``
(``applied_fields``). They differ in what they compare it with:

- ``drift`` knows the exact field set recorded right after its own apply;
- ``apply`` starts cold, so it asks two questions of the live object: is it
  the content we would apply (``DIGEST_ANNOTATION``, a hash of the prepared
  manifest, applied with it), and do we still own every field that content
  sets (``covers``)? Another writer changing a field we apply takes that
  field's ownership away, so the second question catches edits the digest
  cannot see. Any doubt (an unknown field layout, a field the server
  dropped) answers "apply": a needless write is safe, a skipped one is not.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from provisioner.engine.objects import FIELD_MANAGER, Obj, meta_of, owner_of

DIGEST_ANNOTATION = "core.rukpak.io/applied-digest"
"""sha256 of the prepared manifest (without this annotation), applied along with it."""

_IDENTITY_METADATA = ("name", "namespace", "generateName")
"""Fields server-side apply never lists in ``managedFields``."""


def applied_fields(live: Obj) -> Any:
    """``fieldsV1`` of our Apply entry in ``live``'s managedFields, or None."""
    for entry in meta_of(live).get("managedFields") or []:
        if (
            entry.get("manager") == FIELD_MANAGER
            and entry.get("operation") == "Apply"
            and not entry.get("subresource")
        ):
            return entry.get("fieldsV1")
    return None


def lost_reason(live: Obj | None, owner: str) -> str | None:
    """Why ``live`` is no longer an object ``owner`` holds (gone, deleting, relabelled)."""
    if live is None or meta_of(live).get("deletionTimestamp"):
        return "deleted"
    if owner_of(live) != owner:
        return "owner label removed or changed"
    return None


# -- the digest -----------------------------------------------------------------------


def _annotations(obj: Obj) -> dict[str, Any]:
    return meta_of(obj).get("annotations") or {}


def digest(obj: Obj) -> str:
    """sha256 over ``obj``'s canonical JSON, its own digest annotation left out."""
    meta = dict(meta_of(obj))
    annotations = {k: v for k, v in _annotations(obj).items() if k != DIGEST_ANNOTATION}
    if annotations:
        meta["annotations"] = annotations
    else:
        meta.pop("annotations", None)
    text = json.dumps({**obj, "metadata": meta}, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def with_digest(obj: Obj) -> Obj:
    """A copy of ``obj`` (top-level and metadata copied) annotated with its ``digest``."""
    meta = dict(meta_of(obj))
    meta["annotations"] = {**_annotations(obj), DIGEST_ANNOTATION: digest(obj)}
    return {**obj, "metadata": meta}


# -- field ownership ------------------------------------------------------------------


def covers(fields: Any, desired: Obj) -> bool:
    """True when ``fields`` (a ``fieldsV1`` set) holds every field ``desired`` sets.

    Identity (apiVersion, kind, name, namespace) and ``status`` are not owned
    through apply and are left out. A leaf in ``fields`` (``{}``) owns its
    whole value (atomic maps and lists); associative list items are matched by
    their key fields (``k:{...}``), allowing key fields the server defaulted;
    sets of scalars by value (``v:...``).
    """
    if not isinstance(fields, dict):
        return False
    body = {k: v for k, v in desired.items() if k not in ("apiVersion", "kind", "status")}
    meta = {k: v for k, v in meta_of(desired).items()}
    for key in _IDENTITY_METADATA:
        meta.pop(key, None)
    if meta:
        body["metadata"] = meta
    else:
        body.pop("metadata", None)
    return _covers_map(fields, body)


def _covers_map(fields: dict[str, Any], value: dict[str, Any]) -> bool:
    for key, child in value.items():
        if child is None:
            continue  # null asks the server to remove the field: nothing to own
        sub = fields.get(f"f:{key}")
        if not isinstance(sub, dict) or not _covers_value(sub, child):
            return False
    return True


def _covers_value(fields: dict[str, Any], value: Any) -> bool:
    if not fields or not isinstance(value, dict | list):
        return True  # a leaf: we own the value as a whole
    if isinstance(value, dict):
        return _covers_map(fields, value)
    return _covers_list(fields, value)


def _covers_list(fields: dict[str, Any], items: list[Any]) -> bool:
    keyed: list[tuple[dict[str, Any], dict[str, Any]]] = []
    scalars: list[Any] = []
    indexed: dict[int, dict[str, Any]] = {}
    for path, sub in fields.items():
        kind, _, text = path.partition(":")
        try:
            if kind == "k":
                keyed.append((json.loads(text), sub))
            elif kind == "v":
                scalars.append(json.loads(text))
            elif kind == "i":
                indexed[int(text)] = sub
        except ValueError:
            return False
    for index, item in enumerate(items):
        if index in indexed:
            if not _covers_value(indexed[index], item):
                return False
        elif isinstance(item, dict):
            sub = _match(keyed, item)
            if sub is None or not _covers_map(sub, item):
                return False
        elif item not in scalars:
            return False
    return True


def _match(
    keyed: list[tuple[dict[str, Any], dict[str, Any]]], item: dict[str, Any]
) -> dict[str, Any] | None:
    """The fields of the list entry whose key matches ``item`` (absent keys: defaulted)."""
    for key, sub in keyed:
        present = [k for k in key if k in item]
        if present and all(item[k] == key[k] for k in present):
            return sub
    return None


def stale_reason(desired: Obj, live: Obj | None, owner: str) -> str | None:
    """Why applying ``desired`` (as prepared, digest annotated) could change ``live``.

    None means applying it again would be a no-op: the live object is ours, not
    being deleted, carries ``desired``'s digest, and we still own every field
    ``desired`` sets.
    """
    lost = lost_reason(live, owner)
    if lost is not None or live is None:
        return lost or "deleted"
    wanted = _annotations(desired).get(DIGEST_ANNOTATION)
    if wanted is None or _annotations(live).get(DIGEST_ANNOTATION) != wanted:
        return "content changed since the last apply"
    if not covers(applied_fields(live), desired):
        return "fields we apply were changed by another writer"
    return None
