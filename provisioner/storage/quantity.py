"""Kubernetes resource quantities (``1Gi``, ``500M``, ``1e3``, ``100m``) as byte counts.

Where it sits: ``provisioner.storage.plan`` reads a claim's
``spec.resources.requests.storage`` with ``to_bytes`` (rounded up to a whole
byte, as ``resource.Quantity.Value()`` does) and writes the PV's capacity with
``from_bytes`` (binary suffixes when the count divides evenly, like
``resource.NewQuantity(n, BinarySI)``).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

from rukpak.common import errors

INT64_MAX = 2**63 - 1

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
}
_QUANTITY = re.compile(
    r"^(?P<number>[+-]?(?:\d+\.?\d*|\.\d+))"
    r"(?:(?P<binary>Ki|Mi|Gi|Ti|Pi|Ei)|[eE](?P<exp>[+-]?\d+)|(?P<decimal>[numkMGTPE]?))$"
)


def to_bytes(text: str, *, what: str = "quantity") -> int:
    """``text`` as a whole number of bytes (rounded up); InvalidArgument when malformed,
    negative, or larger than a 64-bit signed integer (the CSI capacity field)."""
    match = _QUANTITY.match(str(text).strip())
    if not match:
        raise errors.InvalidArgument(f"{what} {text!r} is not a quantity like 1Gi, 500M or 1024")
    try:
        number = Decimal(match.group("number"))
        if match.group("binary"):
            value = number * _BINARY[match.group("binary")]
        elif match.group("exp") is not None:
            exponent = int(match.group("exp"))
            if abs(exponent) > 100:
                raise errors.InvalidArgument(f"{what} {text!r} is out of range")
            value = number.scaleb(exponent)
        else:
            value = number * _DECIMAL[match.group("decimal") or ""]
    except InvalidOperation:
        raise errors.InvalidArgument(f"{what} {text!r} is not a number") from None
    if value < 0:
        raise errors.InvalidArgument(f"{what} {text!r} is negative")
    result = math.ceil(value)
    if result > INT64_MAX:
        raise errors.InvalidArgument(
            f"{what} {text!r} is larger than {INT64_MAX} bytes, the most a volume can be"
        )
    return result


def from_bytes(count: int) -> str:
    """``count`` bytes as a canonical quantity: ``1Gi``, ``512Mi``, or a plain number."""
    if count <= 0:
        return "0"
    for suffix, factor in reversed(_BINARY.items()):
        if count % factor == 0:
            return f"{count // factor}{suffix}"
    return str(count)
