"""What the image cache needs from outside it: a puller, a metrics observer, a pull policy.

Where it sits: between the image cache (``rukpak.image.cache``) and the things it is
given. The registry client (``rukpak.oci.client.RegistryClient``) satisfies
:class:`Puller` and :class:`StreamingPuller`; the plugin's metrics
(``csi.plugin.metrics``) satisfy :class:`Observer`; the volume attributes
(``rukpak.sources.volume``) carry a :class:`PullPolicy`. Tests pass doubles.
"""

from __future__ import annotations

import contextlib
import enum
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, Protocol, cast

from rukpak.common import errors
from rukpak.oci.auth import Credentials
from rukpak.oci.manifest import Descriptor, Manifest, Platform
from rukpak.oci.reference import Reference


class PullPolicy(enum.Enum):
    IF_NOT_PRESENT = "IfNotPresent"
    ALWAYS = "Always"
    NEVER = "Never"

    @classmethod
    def parse(cls, text: str) -> PullPolicy:
        for policy in cls:
            if policy.value == text:
                return policy
        raise errors.InvalidArgument(
            f"pullPolicy {text!r} is invalid: use IfNotPresent, Always or Never"
        )


class Puller(Protocol):
    """What the cache needs from a registry client (``rukpak.oci.client.RegistryClient``)."""

    def resolve_image(
        self, ref: Reference, platform: Platform | None = None
    ) -> tuple[Descriptor, Manifest]: ...

    def fetch_blob(self, ref: Reference, desc: Descriptor, dest: Path) -> None: ...


class StreamingPuller(Puller, Protocol):
    """A puller that can also stream a blob, verifying it as it is read."""

    def open_blob(
        self, ref: Reference, desc: Descriptor
    ) -> contextlib.AbstractContextManager[BinaryIO]: ...


class CheckingPuller(Puller, Protocol):
    """A puller that can ask whether its credentials may read a manifest (HEAD by digest);
    raises Unauthenticated, PermissionDenied or NotFound when they may not."""

    def check_manifest_access(self, ref: Reference, digest: str) -> None: ...


PullerFactory = Callable[[Credentials | None], Puller]


def streaming(puller: Puller) -> StreamingPuller | None:
    """``puller`` when it can stream blobs (the registry client can; test doubles may not)."""
    return cast(StreamingPuller, puller) if callable(getattr(puller, "open_blob", None)) else None


def checking(puller: Puller) -> CheckingPuller | None:
    """``puller`` when it can check access to a manifest by digest."""
    ok = callable(getattr(puller, "check_manifest_access", None))
    return cast(CheckingPuller, puller) if ok else None


def close(puller: Puller) -> None:
    """Close ``puller`` when it has a ``close`` method."""
    closer = getattr(puller, "close", None)
    if callable(closer):
        closer()


class Observer(Protocol):
    """Metrics hook; ``csi.plugin.metrics`` implements it."""

    def cache_result(self, *, hit: bool) -> None: ...

    def pulled(self, *, seconds: float, nbytes: int) -> None: ...


class NoObserver:
    """An observer that records nothing."""

    def cache_result(self, *, hit: bool) -> None:
        pass

    def pulled(self, *, seconds: float, nbytes: int) -> None:
        pass
