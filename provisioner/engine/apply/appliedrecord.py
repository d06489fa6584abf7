"""The applied record: a fingerprint of the fields a run applied, to spot drift later.

Sits after ``apply`` and beside ``drift``. A run-to-completion instance cannot
watch what it applied after it exits, so it leaves this record behind: per
object, a short hash of the fields our field manager owns right after the
apply (``ownership.applied_fields``). Whoever watches the objects later (the
manager, from its informer caches) calls ``drifted`` with the live objects:
an object is drifted when it is gone, lost its owner label, or another writer
took fields we apply (the same rule as ``drift.drift_reason``, compared by
hash). Content never goes into the record, only refs and hashes.

The encoding is a compact JSON map ``{"<apiVersion>|<kind>|<ns>|<name>": hash}``,
gzip-compressed and base64-encoded (prefix ``gz:``) when large, so it fits in an
annotation.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from provisioner.engine.apply import drift
from provisioner.engine.apply.apply import Applied
from provisioner.engine.apply.ownership import applied_fields
from provisioner.engine.objects import Obj, ObjectRef, split_api_version

HASH_LENGTH = 16
COMPRESS_ABOVE = 8 * 1024
_GZ = "gz:"

Record = dict[str, str]
"""Object key (``key_of``) -> hash of the fields we apply."""


class Unknown:
    """A lookup's answer when it cannot tell (its cache of that kind is not synced)."""


UNKNOWN = Unknown()
Lookup = Callable[[ObjectRef], Obj | Unknown | None]


def key_of(ref: ObjectRef) -> str:
    return "|".join((ref.api_version, ref.kind, ref.namespace, ref.name))


def ref_of(key: str) -> ObjectRef:
    api_version, kind, namespace, name = key.split("|", 3)
    group, version = split_api_version(api_version)
    return ObjectRef(group, version, kind, namespace, name)


def fields_hash(live: Obj) -> str:
    """The hash of the fields our manager owns in ``live`` ("" when it owns none)."""
    fields = applied_fields(live)
    if fields is None:
        return ""
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:HASH_LENGTH]


def of(applied: Iterable[Applied]) -> Record:
    """The record of one run's applied objects."""
    return {key_of(a.ref): fields_hash(a.live) for a in applied}


def encode(record: Mapping[str, str]) -> str:
    text = json.dumps(dict(sorted(record.items())), separators=(",", ":"))
    if len(text) <= COMPRESS_ABOVE:
        return text
    return _GZ + base64.b64encode(gzip.compress(text.encode(), mtime=0)).decode()


def decode(text: str) -> Record:
    """The record in ``text``; raises ValueError when it is not one."""
    if text.startswith(_GZ):
        try:
            text = gzip.decompress(base64.b64decode(text[len(_GZ) :], validate=True)).decode()
        except (OSError, EOFError, ValueError) as err:
            raise ValueError(f"applied record is not valid gzip+base64: {err}") from None
    doc: Any = json.loads(text)
    if not isinstance(doc, dict) or not all(
        isinstance(k, str) and k.count("|") >= 3 and isinstance(v, str) for k, v in doc.items()
    ):
        raise ValueError("applied record is not a map of object keys to hashes")
    return dict(doc)


def drift_of(recorded: str, live: Obj | None, owner: str) -> str | None:
    """Why ``live`` no longer matches its recorded hash, or None when it still does."""
    return drift.drift_reason(recorded, live, owner, fields=fields_hash)


def drifted(record: Mapping[str, str], owner: str, lookup: Lookup) -> dict[str, str] | None:
    """Key -> reason for every drifted object; None when some object's kind is unknown."""
    out: dict[str, str] = {}
    for key, recorded in sorted(record.items()):
        live = lookup(ref_of(key))
        if isinstance(live, Unknown):
            return None
        reason = drift_of(recorded, live, owner)
        if reason is not None:
            out[key] = reason
    return out
