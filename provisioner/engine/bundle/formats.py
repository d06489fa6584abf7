"""Bundle formats as plug-ins: a registry from format name to loader.

First step of the flow: a bundle directory (a mounted CSI volume, an extracted
image, a local tree) becomes a ``Bundle``: an ordered list of manifests, each
remembering the file, document index and line it came from so every later
error can point back at the source (``manifest``). ``plain+v0``
(``formats_plain``) and ``registry+v1`` (``formats_registry``) are built in;
others are added with ``register``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from provisioner.engine.bundle import formats_plain, formats_registry
from provisioner.engine.bundle.manifest import Bundle, Manifest, Source
from provisioner.engine.errors import BundleInvalid

__all__ = [
    "DEFAULT_FORMAT",
    "Bundle",
    "Loader",
    "Manifest",
    "Source",
    "load",
    "load_union",
    "names",
    "register",
]


Loader = Callable[[Path], Bundle]

_FORMATS: dict[str, Loader] = {
    formats_plain.NAME: formats_plain.load,
    formats_registry.NAME: formats_registry.load,
}

DEFAULT_FORMAT = formats_plain.NAME


def register(name: str, loader: Loader) -> None:
    """Make ``load(root, format=name)`` use ``loader``; registering a name again replaces it."""
    _FORMATS[name] = loader


def names() -> list[str]:
    return sorted(_FORMATS)


def load(root: Path, *, format: str = DEFAULT_FORMAT) -> Bundle:
    """Read the bundle at ``root``; ``BundleInvalid`` names the file and document at fault."""
    loader = _FORMATS.get(format)
    if loader is None:
        raise BundleInvalid(f"unknown bundle format {format!r}; known: {', '.join(names())}")
    return loader(root)


def load_union(roots: list[tuple[str, Path]], *, format: str = DEFAULT_FORMAT) -> Bundle:
    """The bundle made of several sources: each ``(destination, root)`` is a bundle of
    ``format`` and the union of their objects is installed, in the order given. Two sources
    with the same object are refused naming both (``BundleInvalid``); files are named with
    their destination."""
    manifests: list[Manifest] = []
    seen: dict[tuple[str, str, str, str], Manifest] = {}
    for destination, root in roots:
        part = load(root, format=format)
        for manifest in part.manifests:
            moved = Manifest(
                manifest.obj,
                Source(
                    f"{destination.rstrip('/')}/{manifest.source.file}",
                    manifest.source.document,
                    manifest.source.line,
                ),
            )
            ref = moved.ref
            key = (ref.group, ref.kind, ref.namespace, ref.name)
            if key in seen:
                raise BundleInvalid(
                    f"two sources hold the same object: {seen[key].describe()} and "
                    f"{moved.describe()}; keep it in one source"
                )
            seen[key] = moved
            manifests.append(moved)
    return Bundle(format, tuple(manifests))
