"""Bundle formats as plug-ins: a registry from format name to loader.

First step of the flow: a bundle directory (a mounted CSI volume, an extracted
image, a local tree) becomes a ``Bundle``: an ordered list of manifests, each
remembering the file, document index and line it came from so every later
error can point back at the source. ``plain+v0`` registers itself from
``formats_plain``; ``registry+v1`` can be added the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from provisioner.engine.errors import BundleInvalid
from provisioner.engine.objects import Obj, ObjectRef


@dataclass(frozen=True)
class Source:
    """Where a manifest came from: file (relative to the bundle root), document index, line."""

    file: str
    document: int
    line: int

    def __str__(self) -> str:
        return f"{self.file} document {self.document} (line {self.line})"


@dataclass(frozen=True)
class Manifest:
    obj: Obj
    """The object; treated as immutable (the engine copies before it changes anything)."""
    source: Source

    @cached_property
    def ref(self) -> ObjectRef:
        return ObjectRef.of(self.obj)

    def describe(self) -> str:
        """``Deployment ns/web from 10_app.yaml document 2 (line 14)``."""
        return f"{self.ref} from {self.source}"


@dataclass(frozen=True)
class Bundle:
    format: str
    manifests: tuple[Manifest, ...]


Loader = Callable[[Path], Bundle]

_FORMATS: dict[str, Loader] = {}

DEFAULT_FORMAT = "plain+v0"


def register(name: str, loader: Loader) -> None:
    """Make ``load(root, format=name)`` use ``loader``; registering a name again replaces it."""
    _FORMATS[name] = loader


def names() -> list[str]:
    return sorted(_FORMATS)


def load(root: Path, *, format: str = DEFAULT_FORMAT) -> Bundle:
    """Read the bundle at ``root``; ``BundleInvalid`` names the file and document at fault."""
    # Importing here registers the built-in formats without an import cycle.
    from provisioner.engine import formats_plain  # noqa: F401

    loader = _FORMATS.get(format)
    if loader is None:
        raise BundleInvalid(f"unknown bundle format {format!r}; known: {', '.join(names())}")
    return loader(root)
