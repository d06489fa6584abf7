"""Loggable views of protobuf messages with secrets masked.

Where it sits: beside the gRPC edge. The servicers and the structured logger
call ``redact(request)`` before a CSI message reaches a log line, so fields the
CSI spec marks with the ``csi_secret`` field option (every ``secrets`` map,
at any depth) appear only as ``"***"``. The walk is driven by descriptors, not
by field names, so new spec fields marked secret are covered without changes
here.

The result is plain JSON data: keys are proto field names (``volume_id``, not
``volumeId``), enums are their names, 64-bit integers stay integers, bytes
are base64, well-known types (wrappers, ``Timestamp``) use their proto3 JSON
form. Only fields that are set appear, which keeps log lines short.
"""

from __future__ import annotations

import base64
import functools
from typing import TypeAlias, cast

from google.protobuf import descriptor, json_format, message

from csi.proto import csi_pb2

#: What a secret field's value is replaced with.
REDACTED = "***"

JSON: TypeAlias = str | int | float | bool | list["JSON"] | dict[str, "JSON"] | None

_WELL_KNOWN_PREFIX = "google.protobuf."
_CSI_SECRET = csi_pb2.csi_secret.full_name  # "csi.v1.csi_secret"


@functools.cache
def is_secret(field: descriptor.FieldDescriptor) -> bool:
    """Whether ``field`` carries the CSI ``csi_secret`` option."""
    return any(
        option.full_name == _CSI_SECRET and value is True
        for option, value in field.GetOptions().ListFields()
    )


def redact(msg: message.Message) -> dict[str, JSON]:
    """Return ``msg`` as a JSON-able dict with every ``csi_secret`` field masked.

    A secret field that is set becomes ``REDACTED`` as a whole (a ``secrets``
    map shows neither its keys nor its values); unset fields are left out.
    """
    out: dict[str, JSON] = {}
    for field, value in msg.ListFields():
        out[field.name] = REDACTED if is_secret(field) else _field(field, value)
    return out


def secret_field_paths(desc: descriptor.Descriptor) -> list[str]:
    """Dotted paths of every ``csi_secret`` field reachable from a message type.

    For example ``["secrets"]`` for ``NodePublishVolumeRequest``. Useful in
    tests and to document what a log line hides.
    """
    return _secret_paths(desc, prefix="", seen=frozenset())


def _secret_paths(desc: descriptor.Descriptor, *, prefix: str, seen: frozenset[str]) -> list[str]:
    if desc.full_name in seen:  # recursive message types
        return []
    paths: list[str] = []
    for field in desc.fields:
        path = prefix + field.name
        if is_secret(field):
            paths.append(path)
            continue
        sub = field.message_type
        if sub is not None and sub.GetOptions().map_entry:
            sub = sub.fields_by_name["value"].message_type  # map<_, Message>
        if sub is not None:
            paths.extend(_secret_paths(sub, prefix=path + ".", seen=seen | {desc.full_name}))
    return paths


def _field(field: descriptor.FieldDescriptor, value: object) -> JSON:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        value_field = field.message_type.fields_by_name["value"]
        mapping = cast("dict[object, object]", value)
        return {str(k): _single(value_field, v) for k, v in mapping.items()}
    if field.is_repeated:
        return [_single(field, v) for v in cast("list[object]", value)]
    return _single(field, value)


def _single(field: descriptor.FieldDescriptor, value: object) -> JSON:
    if isinstance(value, message.Message):
        if value.DESCRIPTOR.full_name.startswith(_WELL_KNOWN_PREFIX):
            return cast(JSON, json_format.MessageToDict(value, preserving_proto_field_name=True))
        return redact(value)
    if field.enum_type is not None and isinstance(value, int):
        enum_value = field.enum_type.values_by_number.get(value)
        return enum_value.name if enum_value is not None else value
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, str | int | float | bool):
        return value
    return repr(value)
