"""``rukpak.common.jsonfast``: what orjson refuses goes to the standard library, so the
hot paths accept exactly what ``json`` accepts, and fail the same way. Pure logic."""

from __future__ import annotations

import json
from typing import NamedTuple

import pytest

from rukpak.common import jsonfast


class Row(NamedTuple):
    parent: int
    name: str


@pytest.mark.parametrize(
    "value",
    [
        {"rows": [Row(-1, ""), Row(0, "manifests")], "n": 1},  # NamedTuples are arrays
        ["caf\u00e9", "\u65e5\u672c"],  # non-ASCII text
        ["\udc80not-utf8"],  # a tar name that is not UTF-8: orjson refuses, json writes it
        [2**63 - 1, -(2**63)],  # the 64-bit edges
    ],
)
def test_what_json_writes_comes_back_the_same(value: object) -> None:
    encoded = jsonfast.dumps(value)
    assert b" " not in encoded.replace(b"\\u", b"")  # compact
    assert jsonfast.loads(encoded) == json.loads(json.dumps(value))


def test_documents_orjson_refuses_are_read_as_json_reads_them() -> None:
    assert jsonfast.loads(b'["\\udc80"]') == ["\udc80"]
    assert jsonfast.dumps([2**70]) == b"[1180591620717411303424]"  # written exactly


def test_an_integer_beyond_64_bits_is_read_as_a_float_an_approximation() -> None:
    (value,) = jsonfast.loads(b"[123456789012345678901234567890]")
    assert isinstance(value, float) and value == pytest.approx(1.2345678901234568e29)


@pytest.mark.parametrize("data", [b"", b"[1,", b'{"a":}', b"\xff\xfe", b"[" * 100_000])
def test_broken_documents_fail_as_json_fails(data: bytes) -> None:
    with pytest.raises((ValueError, RecursionError)):
        jsonfast.loads(data)


def test_what_cannot_be_json_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        jsonfast.dumps({"a": object()})
    with pytest.raises(TypeError):
        jsonfast.dumps({1.5j})
