"""Is this directory a plain+v0 bundle? The check ``rukpak bundle build`` runs first.

Two layers of rules, so that what builds is exactly what deploys:

- the image's own rules, checked here: ``manifests/`` exists and is a real
  directory, and holds only regular ``.yaml``/``.yml``/``.json`` files (no
  subdirectories, symlinks, devices; dotfiles are left out of the image);
- the content rules of the plain+v0 format, checked by the same loader the
  instance pod uses (``provisioner.engine.bundle.formats``): every document parses
  and is a named Kubernetes object, no object twice, at least one object.

Errors are InvalidArgument naming the file (and document and line, for
content) and what to change. Only local files are read.
"""

from __future__ import annotations

import os
import stat
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from provisioner.engine.bundle import formats_plain
from rukpak.common import errors

MANIFESTS_DIR = "manifests"
SUFFIXES = (".yaml", ".yml", ".json")


@dataclass(frozen=True)
class BundleFile:
    """One manifest file of a bundle, as it will appear in the layer."""

    name: str  # the file name inside manifests/
    path: Path
    size: int
    objects: int  # Kubernetes objects it holds


def validate_bundle(root: Path) -> list[BundleFile]:
    """The manifest files of the plain+v0 bundle at ``root``, sorted by name.

    Entries of ``root`` other than ``manifests/`` are checked and collected by
    ``provisioner.bundle.extras``.
    """
    if not root.is_dir():
        raise errors.InvalidArgument(
            f"bundle directory {root} does not exist or is not a directory"
        )
    manifests = root / MANIFESTS_DIR
    try:
        mode = os.lstat(manifests).st_mode
    except FileNotFoundError:
        raise errors.InvalidArgument(
            f"{root} is not a plain+v0 bundle: it has no {MANIFESTS_DIR}/ directory; "
            f"put the Kubernetes manifests in {manifests}/"
        ) from None
    if not stat.S_ISDIR(mode):
        raise errors.InvalidArgument(
            f"{manifests} must be a directory (found a symlink or file); "
            "bundles carry regular files only"
        )
    names = sorted(n for n in os.listdir(manifests) if not n.startswith("."))
    if not names:
        raise errors.InvalidArgument(
            f"{manifests}/ is empty; a bundle needs at least one manifest file"
        )
    checked = [_check_file(manifests, name) for name in names]
    counts = _check_content(root)
    return [
        BundleFile(name=name, path=path, size=size, objects=counts[f"{MANIFESTS_DIR}/{name}"])
        for name, path, size in checked
    ]


def _check_file(manifests: Path, name: str) -> tuple[str, Path, int]:
    path = manifests / name
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise errors.InvalidArgument(f"{path!s}: file name is not valid UTF-8; rename it") from None
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        raise errors.InvalidArgument(
            f"{path} is a symlink; bundles carry regular files only: replace it with a copy"
        )
    if stat.S_ISDIR(st.st_mode):
        raise errors.InvalidArgument(
            f"{path} is a directory; {MANIFESTS_DIR}/ must be flat: move its files up "
            "(prefix names like 01_, 02_ to order them)"
        )
    if not stat.S_ISREG(st.st_mode):
        raise errors.InvalidArgument(f"{path} is not a regular file; remove it")
    if not name.endswith(SUFFIXES):
        raise errors.InvalidArgument(
            f"{path}: only {', '.join(SUFFIXES)} files may be in {MANIFESTS_DIR}/; "
            "rename or remove it"
        )
    return name, path, st.st_size


def _check_content(root: Path) -> Counter[str]:
    """Objects per file (``manifests/<name>``), as the deploying side reads them."""
    try:
        bundle = formats_plain.load(root, dotfiles=False)  # as the image will hold it
    except errors.InvalidArgument as exc:
        raise errors.InvalidArgument(f"bundle {root}: {exc.message}") from None
    except OSError as exc:
        raise errors.InvalidArgument(
            f"bundle {root}: {exc.filename or 'a file'} cannot be read: {exc.strerror}"
        ) from None
    return Counter(m.source.file for m in bundle.manifests)
