"""rukpak.image.ustar reads every header exactly as tarfile.TarInfo.frombuf does; the gzip
reader of rukpak.image.layerio inflates many-member streams (eStargz) exactly.

The fast reader may hand a header back to tarfile (None); whatever it returns
itself must equal tarfile's reading, field by field, and whatever tarfile refuses
it must refuse with the same error.
"""

from __future__ import annotations

import gzip
import io
import random
import tarfile
from typing import Literal

import pytest

from rukpak.image import layerio, ustar

ENC, ERR = "utf-8", "surrogateescape"


def header(name: str, *, fmt: Literal[0, 1, 2] = tarfile.USTAR_FORMAT, **fields: object) -> bytes:
    info = tarfile.TarInfo(name)
    for key, value in fields.items():
        setattr(info, key, value)
    return info.tobuf(fmt, ENC, ERR)[-tarfile.BLOCKSIZE :]


def reading(buf: bytes) -> tuple[str, object]:
    """("ok", fields) or ("error", exception class) for tarfile's own reader."""
    try:
        info = tarfile.TarInfo.frombuf(buf, ENC, ERR)
    except Exception as exc:
        return "error", type(exc)
    return "ok", (info.get_info(), info.chksum)


def fast_reading(buf: bytes) -> tuple[str, object] | None:
    try:
        info = ustar.parse(tarfile.TarInfo, buf, ENC, ERR)
    except Exception as exc:
        return "error", type(exc)
    if info is None:
        return None
    return "ok", (info.get_info(), info.chksum)


def with_checksum(buf: bytes) -> bytes:
    """``buf`` with its checksum field recomputed (after a deliberate edit)."""
    body = buf[:148] + b" " * 8 + buf[156:]
    return body[:148] + b"%06o\0 " % sum(body) + body[156:]


CASES = {
    "regular": header("manifests/a.yaml", size=1234, mtime=1_700_000_000, mode=0o644),
    "directory": header("manifests/", type=tarfile.DIRTYPE, mode=0o755),
    "symlink": header("link", type=tarfile.SYMTYPE, linkname="../target"),
    "hard link": header("copy", type=tarfile.LNKTYPE, linkname="manifests/a.yaml"),
    "ustar prefix": header("d" * 120 + "/" + "f" * 90),
    "gnu format": header("g.yaml", fmt=tarfile.GNU_FORMAT, size=7, uname="root", gname="root"),
    "gnu base-256 uid": header("big", fmt=tarfile.GNU_FORMAT, uid=8**8 + 5),
    "pax header block": tarfile.TarInfo("x" * 200).tobuf(tarfile.PAX_FORMAT, ENC, ERR)[:512],
    "device numbers": header("dev", type=tarfile.CHRTYPE, devmajor=4, devminor=64),
    "non-ascii name": header("déjà.yaml", fmt=tarfile.GNU_FORMAT),
    "v7 directory": with_checksum(
        header("olddir/", type=tarfile.AREGTYPE)[:156] + b"\0" + header("olddir/")[157:]
    ),
    "text after NUL in size": with_checksum(
        header("n", size=5)[:124] + b"0000000005\0x" + header("n", size=5)[136:]
    ),
    "blank mode": with_checksum(header("b")[:100] + b" " * 8 + header("b")[108:]),
    "not octal": with_checksum(header("q")[:124] + b"00000000009 " + header("q")[136:]),
    "bad checksum": header("c")[:148] + b"000001\0 " + header("c")[156:],
    "end of archive": bytes(tarfile.BLOCKSIZE),
    "truncated": header("t")[:300],
    "empty": b"",
}


@pytest.mark.parametrize("buf", CASES.values(), ids=CASES.keys())
def test_same_reading_as_tarfile(buf: bytes) -> None:
    fast = fast_reading(buf)
    if fast is not None:
        assert fast == reading(buf)


def test_common_headers_take_the_fast_path() -> None:
    for name in ("regular", "directory", "symlink", "hard link", "ustar prefix", "gnu format"):
        assert fast_reading(CASES[name]) is not None, name
    assert fast_reading(CASES["gnu base-256 uid"]) is None  # left to tarfile


def test_mutated_headers_read_the_same() -> None:
    rng = random.Random(12)
    seeds = [buf for buf in CASES.values() if len(buf) == tarfile.BLOCKSIZE]
    fast_ok = 0
    for _ in range(10000):
        buf = bytearray(rng.choice(seeds))
        for _ in range(rng.randint(1, 4)):
            buf[rng.randrange(len(buf))] = rng.choice(b"\0 07x\x80\xff/")
        mutated = bytes(buf) if rng.random() < 0.5 else with_checksum(bytes(buf))
        fast = fast_reading(mutated)
        if fast is not None:
            assert fast == reading(mutated), mutated
            fast_ok += fast[0] == "ok"
    assert fast_ok > 1000  # the comparison really exercised the fast reader


def test_layer_reader_uses_it(tmp_path: object) -> None:
    assert layerio._CappedTarInfo.frombuf(CASES["regular"], ENC, ERR).name == "manifests/a.yaml"
    with pytest.raises(tarfile.HeaderError):
        layerio._CappedTarInfo.frombuf(CASES["bad checksum"], ENC, ERR)


# --- the gzip reader: many members, padding, truncation ---------------------------------


def _inflate_all(data: bytes) -> bytes:
    reader = layerio._Gunzip(io.BytesIO(data))
    try:
        return b"".join(iter(lambda: reader.read(1 << 16), b""))
    finally:
        reader.close()


@pytest.mark.parametrize("padding", [b"", b"\0" * 7, b"\0" * 70_000])
def test_many_gzip_members_inflate_to_their_concatenation(padding: bytes) -> None:
    rng = random.Random(3)
    parts = [rng.randbytes(rng.randint(0, 30_000)) for _ in range(300)]
    data = b"".join(
        gzip.compress(p, mtime=0) + (padding if i % 7 == 0 else b"") for i, p in enumerate(parts)
    )
    assert _inflate_all(data) == b"".join(parts)


def test_a_member_cut_short_is_an_error_not_short_content() -> None:
    data = gzip.compress(b"first" * 1000) + gzip.compress(bytes(range(256)) * 400)[:-9]
    with pytest.raises(EOFError):
        _inflate_all(data)
