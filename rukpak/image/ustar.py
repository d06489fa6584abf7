"""A faster reading of the common tar header: one 512-byte ustar/GNU block → TarInfo fields.

Where it sits: under ``rukpak.image.layerio``, whose ``TarInfo`` subclass calls
:func:`parse` from ``frombuf``. ``tarfile`` parses every header field through
small Python helpers (about 30 µs a member, a third of the extractor's own time
on a 10,000-file layer); this does the same work with fewer calls. It reads
only headers whose number fields are plain octal and whose type is not an old
GNU sparse member; for anything else it returns ``None`` and ``tarfile``'s own
parser runs. The result and the errors are those of ``tarfile.TarInfo.frombuf``:
the same fields, the same checksum rule (unsigned, else signed sums), the same
V7 directory, trailing-slash and ustar prefix handling.
"""

from __future__ import annotations

import tarfile
from typing import TypeVar

T = TypeVar("T", bound=tarfile.TarInfo)


def parse(cls: type[T], buf: bytes, encoding: str, errors: str) -> T | None:
    """A ``cls`` made from ``buf`` as ``tarfile`` would, or None to let ``tarfile`` do it."""
    if len(buf) != tarfile.BLOCKSIZE or buf[156:157] == tarfile.GNUTYPE_SPARSE:
        return None
    if not buf.strip(b"\0"):
        raise tarfile.EOFHeaderError("end of file header")  # type: ignore[attr-defined]
    # Octal number fields, padded with NULs and spaces. Anything else (base-256,
    # text after a NUL) is left to tarfile.
    try:
        chksum = _octal(buf[148:156])
        mode = _octal(buf[100:108])
        uid = _octal(buf[108:116])
        gid = _octal(buf[116:124])
        size = _octal(buf[124:136])
        mtime = _octal(buf[136:148])
        devmajor = _octal(buf[329:337])
        devminor = _octal(buf[337:345])
    except ValueError:
        return None
    if chksum != 256 + sum(buf) - sum(buf[148:156]) and chksum != _signed_sum(buf):
        raise tarfile.InvalidHeaderError("bad checksum")  # type: ignore[attr-defined]
    obj = cls()
    name = _text(buf[0:100], encoding, errors)
    obj.mode, obj.uid, obj.gid, obj.size, obj.mtime = mode, uid, gid, size, mtime
    obj.chksum = chksum
    obj.type = kind = buf[156:157]
    obj.linkname = _text(buf[157:257], encoding, errors)
    obj.uname = _text(buf[265:297], encoding, errors)
    obj.gname = _text(buf[297:329], encoding, errors)
    obj.devmajor, obj.devminor = devmajor, devminor
    prefix = _text(buf[345:500], encoding, errors)
    if kind == tarfile.AREGTYPE and name.endswith("/"):
        obj.type = kind = tarfile.DIRTYPE
    if kind == tarfile.DIRTYPE:
        name = name.rstrip("/")
    if prefix and kind not in tarfile.GNU_TYPES:
        name = prefix + "/" + name
    obj.name = name
    return obj


def _octal(field: bytes) -> int:
    """The field's octal number, as tarfile reads it; ValueError where it might differ."""
    digits = field.rstrip(b"\0 ")
    if b"\0" in digits:
        raise ValueError("text after a NUL")
    return int(digits, 8) if digits else 0


def _text(field: bytes, encoding: str, errors: str) -> str:
    end = field.find(b"\0")
    return (field if end < 0 else field[:end]).decode(encoding, errors)


def _signed_sum(buf: bytes) -> int:
    total = 256
    for i, byte in enumerate(buf):
        if not 148 <= i < 156:
            total += byte - 256 if byte > 127 else byte
    return total
