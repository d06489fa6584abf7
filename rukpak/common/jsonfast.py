"""Compact JSON on hot paths: orjson where it can, the standard library where it cannot.

Where it sits: in the shared core, below the FUSE store's tree indexes and lazy plans
(``csi.fuse.index``, ``csi.fuse.lazy``), which read an eStargz TOC of 10,000 entries
and write two documents of that size while NodePublishVolume waits; the standard
library's codec took a quarter of that publish, orjson takes about a fifth of that.

What orjson refuses and the standard library accepts is handed to the standard
library, so what these functions accept is what ``json`` accepts: strings with lone
surrogates (``\\udc80`` escapes, which a tar member name that is not UTF-8 becomes),
integers outside 64 bits when written. One difference stays: orjson *reads* an integer
beyond 64 bits as a float (an approximation); no document read here holds one (sizes,
offsets, modes and times are checked against budgets and ranges, which such a number
fails either way). Tuples (NamedTuples included) are arrays, as ``json`` writes them.
The output of :func:`dumps` is compact (no spaces); non-ASCII text is UTF-8, or
``\\u`` escapes where the standard library wrote it.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def loads(data: bytes | str) -> Any:
    """Parse a JSON document (ValueError, as ``json.loads``, when it is not one)."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return json.loads(data)  # lone surrogates, huge integers: or the same error


def dumps(value: Any) -> bytes:
    """Encode ``value`` compactly (TypeError, as ``json.dumps``, for what it cannot)."""
    try:
        return orjson.dumps(value, default=_array)
    except orjson.JSONEncodeError:
        return json.dumps(value, separators=(",", ":")).encode()


def _array(value: Any) -> Any:
    if isinstance(value, tuple):  # a NamedTuple: orjson writes plain tuples only
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
