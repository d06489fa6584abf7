"""The rules for one tar member, shared by every extractor of untrusted layers.

Where it sits: under ``rukpak.image.extract`` (bind mode: members become files of a
staging tree) and ``csi.fuse.index`` (FUSE mode: members become entries of an
index), so both apply the same budgets (``Limits``), the same path rules
(``split_name`` refuses ``..``), the same symlink rewriting (``safe_symlink_target``),
the same read-only modes (``final_mode``) and one check of every entry's path
(``check_entry``: ``..`` refused, depth and length within ``Limits``, a leading
``/`` stripped and reported). ``Refused`` marks an entry that is skipped and
reported, not a failure of the layer.
"""

from __future__ import annotations

import errno
import posixpath
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field

from rukpak.common import errors
from rukpak.image import layerio
from rukpak.image.layerio import Layer, shown

WHITEOUT_PREFIX = ".wh."
OPAQUE_MARKER = ".wh..wh..opq"
MAX_WARNINGS = 50
MAX_SYMLINK_HOPS = 40  # as the kernel's MAXSYMLINKS: a longer chain fails there, never escapes


@dataclass(frozen=True)
class Limits:
    """Budgets for one image: bytes written (all layers) and entries created; the
    deepest path (components) and longest path (bytes, PATH_MAX) an entry may have."""

    max_bytes: int = 2 * 1024**3
    max_entries: int = 200_000
    max_depth: int = 128
    max_path_bytes: int = 4096

    @property
    def stream_bytes(self) -> int:
        """Decompressed bytes one layer may stream: the byte budget plus room for tar
        headers and padding."""
        return self.max_bytes + self.max_entries * 1024 + (1 << 20)


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

    def charge(self, size: int, limits: Limits, image: str) -> None:
        """Count one entry (and its bytes) against the image's budgets; every header
        counts, even refused ones and whiteouts."""
        self.entries += 1
        self.bytes += size
        if self.entries > limits.max_entries:
            raise errors.ResourceExhausted(
                f"image {image} has more than {limits.max_entries} files (the unpack "
                "budget); use a smaller image or raise --max-unpacked-files"
            )
        if self.bytes > limits.max_bytes:
            raise errors.ResourceExhausted(
                f"image {image} unpacks to more than {limits.max_bytes} bytes (the unpack "
                "budget); use a smaller image or raise --max-unpacked-bytes"
            )


class Refused(Exception):
    """An entry that is skipped (and reported), not a failure of the layer."""


def split_name(name: str) -> tuple[str, ...]:
    """Normalise a member name into path components, refusing ``..``."""
    split = name.split("/")
    if "" in split or "." in split:
        split = [p for p in split if p not in ("", ".")]
    if ".." in split:
        raise Refused("path contains '..'")
    return tuple(split)


def check_entry(name: str, *, limits: Limits, image: str, stats: ExtractStats) -> tuple[str, ...]:
    """The one check of an entry's path, for every extractor: its components.

    ``..`` is :class:`Refused` (the entry is skipped); a path deeper or longer than
    ``limits`` refuses the whole layer (InvalidArgument naming the entry), before any
    work proportional to its depth; a leading ``/`` is stripped (as GNU tar does) and
    reported in ``stats``. An empty result is the root itself (``./``).
    """
    parts = split_name(name)
    size = len(name.encode(errors="surrogateescape"))
    if len(parts) > limits.max_depth or size > limits.max_path_bytes:
        raise errors.InvalidArgument(
            f"image {image}: entry {shown(name)!r} has {len(parts)} components and "
            f"{size} bytes; at most {limits.max_depth} and {limits.max_path_bytes} are "
            "allowed: rebuild the image with shallower paths"
        )
    if parts and name.startswith("/"):
        stats.warn(f"{shown(name)!r}: leading '/' removed (absolute path)")
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


def apply_layer(
    layer: Layer,
    apply: Callable[[tarfile.TarFile, tarfile.TarInfo], None],
    *,
    image: str,
    limits: Limits,
    stats: ExtractStats,
    doing: str = "unpacking",
) -> None:
    """Read ``layer``'s members in order and ``apply`` each; the errors of every extractor.

    An entry ``apply`` refuses is skipped and reported in ``stats``; a header the
    reader refuses or bytes that are not a (compressed) tar are InvalidArgument, a
    full disk is ResourceExhausted and another disk error Internal. ``doing`` names
    the work in messages ("unpacking", "storing").
    """
    name = layer.digest or layer.path.name
    try:
        with layerio.open_tar_stream(layer, limit=limits.stream_bytes, image=image) as tar:
            for member in tar:
                try:
                    apply(tar, member)
                except Refused as refused:
                    stats.warn(f"layer {name}: {shown(member.name)!r}: {refused}")
    except errors.RukpakError:
        raise
    except layerio.HeaderRefused as exc:
        raise errors.InvalidArgument(
            f"image {image}: layer {name} refused: {exc}; rebuild the image with "
            "ordinary file names"
        ) from None
    except Exception as exc:
        if layerio.is_unreadable(exc):
            raise unreadable(image, name, exc) from exc
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise errors.ResourceExhausted(
                f"image {image}: no space left on the node while {doing} layer {name}"
            ) from exc
        if isinstance(exc, OSError):
            raise errors.Internal(
                f"image {image}: {doing} layer {name} failed: {shown(str(exc))}"
            ) from exc
        raise


Probe = Callable[[list[str]], "str | bool | None"]
"""What is at a path of the tree: a symlink's target, True for anything else, None if
nothing is there."""


def resolves_above(link: tuple[str, ...], target: str, probe: Probe) -> bool:
    """Whether the symlink at ``link`` (with ``target``) resolves above the tree's root.

    Resolves component by component through ``probe``, following in-tree symlinks as
    the kernel would once the tree is mounted elsewhere. Missing components and loops
    cannot escape (the kernel fails there), so they count as safe.
    """
    stack: list[str] = list(link[:-1])
    pending = list(reversed(target.split("/")))
    hops = 0
    while pending:
        comp = pending.pop()
        if comp in ("", "."):
            continue
        if comp == "..":
            if not stack:
                return True
            stack.pop()
            continue
        found = probe([*stack, comp])
        if found is None:
            return False
        if isinstance(found, str):
            hops += 1
            if hops > MAX_SYMLINK_HOPS:
                return False
            if found.startswith("/"):
                return True  # absolute links were rewritten; one here points off-tree
            pending.extend(reversed(found.split("/")))
            continue
        stack.append(comp)
    return False
