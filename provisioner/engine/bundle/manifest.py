"""What a loaded bundle is: manifests, each with the file, document and line it came from.

The data every bundle format produces (``formats``, ``formats_plain``) and the
rest of the engine consumes (ordering, apply, diff): kept apart from the
format registry so that formats depend on it and not on each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

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
    """One object of a bundle and where it was read: what ordering, apply and diff take,
    and what their errors name (:meth:`describe`)."""

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
