"""The rules for one tar member, shared by every extractor of untrusted layers.

Where it sits: under ``csi.image.extract`` (bind mode: members become files of a
staging tree) and ``csi.fuse.index`` (FUSE mode: members become entries of an
index), so both apply the same budgets (``Limits``), the same path rules
(``split_name`` refuses ``..``), the same symlink rewriting (``safe_symlink_target``)
and the same read-only modes (``final_mode``). ``Refused`` marks an entry that
is skipped and reported, not a failure of the layer.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass, field

from csi.common import errors
from csi.image.layerio import shown

WHITEOUT_PREFIX = ".wh."
OPAQUE_MARKER = ".wh..wh..opq"
MAX_WARNINGS = 50


@dataclass(frozen=True)
class Limits:
    """Budgets for one image: bytes written (all layers) and entries created; the
    deepest path (components) and longest path (bytes, PATH_MAX) an entry may have."""

    max_bytes: int = 2 * 1024**3
    max_entries: int = 200_000
    max_depth: int = 128
    max_path_bytes: int = 4096


@dataclass
class ExtractStats:
    """What extraction did; ``warnings`` lists refused or altered entries."""

    bytes: int = 0
    entries: int = 0
    symlinks: int = 0
    warnings: list[str] = field(default_factory=list)
    suppressed_warnings: int = 0

    def warn(self, message: str) -> None:
        if len(self.warnings) < MAX_WARNINGS:
            self.warnings.append(message)
        else:
            self.suppressed_warnings += 1


class Refused(Exception):
    """An entry that is skipped (and reported), not a failure of the layer."""


def split_name(name: str) -> tuple[str, ...]:
    """Normalise a member name into path components, refusing ``..``."""
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if ".." in parts:
        raise Refused("path contains '..'")
    return parts


def safe_symlink_target(parts: tuple[str, ...], target: str) -> str:
    """Rewrite an absolute target relative to the tree root; refuse one that climbs out."""
    if not target:
        raise Refused("symlink has an empty target")
    if target.startswith("/"):
        rel = posixpath.normpath(target.lstrip("/")) if target.strip("/") else "."
        depth = len(parts) - 1
        target = posixpath.join(*([".."] * depth), rel) if depth else rel
    # Lexically, ``..`` past the root would stay at "/"; detect the climb by counting.
    level = len(parts) - 1
    for comp in target.split("/"):
        if comp == "..":
            level -= 1
            if level < 0:
                raise Refused(f"symlink target {target!r} points outside the image")
        elif comp not in ("", "."):
            level += 1
    return target


def final_mode(mode: int) -> int:
    """0444, or 0555 when any execute bit is set: files are created read-only."""
    return 0o555 if mode & 0o111 else 0o444


def unreadable(image: str, name: str, exc: Exception) -> errors.InvalidArgument:
    return errors.InvalidArgument(
        f"image {image}: layer {name} is not a readable tar archive ({shown(str(exc))}); "
        "check the image was built correctly"
    )
