"""Manifests, indexes, descriptors and platforms, parsed and checked.

Sits between the registry client (``rukpak.oci.client``), which fetches manifest
bytes and verifies their digest, and the node's puller, which needs a list of
layer descriptors to fetch and unpack. :func:`parse_manifest` turns bytes into
a :class:`Manifest` or :class:`Index` after checking their shape (a malformed
manifest is InvalidArgument naming what is wrong, never a KeyError later);
:func:`select_platform` picks the entry of an index for a node, following
containerd's rules (arm64 means arm64/v8; an armv7 node can run v6 and v5).
"""

from __future__ import annotations

import json
import platform as _platform
from dataclasses import dataclass, field
from typing import Any

from rukpak.common import errors
from rukpak.oci import digest as digests
from rukpak.oci import mediatypes

# uname machine -> (GOARCH, variant)
_MACHINES: dict[str, tuple[str, str | None]] = {
    "x86_64": ("amd64", None),
    "amd64": ("amd64", None),
    "i386": ("386", None),
    "i686": ("386", None),
    "aarch64": ("arm64", "v8"),
    "arm64": ("arm64", "v8"),
    "armv8l": ("arm", "v8"),
    "armv7l": ("arm", "v7"),
    "armv7": ("arm", "v7"),
    "armhf": ("arm", "v7"),
    "armv6l": ("arm", "v6"),
    "armel": ("arm", "v6"),
    "armv5l": ("arm", "v5"),
    "ppc64le": ("ppc64le", None),
    "s390x": ("s390x", None),
    "riscv64": ("riscv64", None),
}

# Variants a node of the given arm variant can also run, best first.
_ARM_FALLBACK: dict[str, tuple[str, ...]] = {
    "v8": ("v8", "v7", "v6", "v5"),
    "v7": ("v7", "v6", "v5"),
    "v6": ("v6", "v5"),
    "v5": ("v5",),
}


@dataclass(frozen=True)
class Platform:
    """``os/architecture[/variant]`` in Go's GOOS/GOARCH names, normalised."""

    os: str
    architecture: str
    variant: str | None = None

    @classmethod
    def parse(cls, text: str) -> Platform:
        """Parse ``linux/arm64/v8``, ``linux/amd64`` or ``linux/aarch64``."""
        parts = text.strip().lower().split("/") if isinstance(text, str) else []
        if len(parts) not in (2, 3) or not all(parts):
            raise errors.InvalidArgument(
                f"platform {text!r} is invalid: write os/architecture[/variant], "
                "e.g. 'linux/amd64' or 'linux/arm64/v8'"
            )
        variant = parts[2] if len(parts) == 3 else None
        return cls.normalized(parts[0], parts[1], variant)

    @classmethod
    def normalized(cls, os: str, architecture: str, variant: str | None = None) -> Platform:
        """Map uname-style names to Go's and fill in default variants."""
        arch = architecture.lower()
        if arch in _MACHINES and arch not in ("arm64", "amd64"):
            arch, default_variant = _MACHINES[arch]
            variant = variant or default_variant
        if arch == "arm64" and variant in (None, "v8", "8"):
            variant = "v8"
        if arch == "arm" and variant is None:
            variant = "v7"
        if variant is not None and variant.isdigit():
            variant = f"v{variant}"
        if arch == "amd64" and variant == "v1":
            variant = None
        return cls(os=os.lower(), architecture=arch, variant=variant)

    @classmethod
    def current(cls) -> Platform:
        """The platform of this machine (the node the plugin runs on)."""
        machine = _platform.machine().lower()
        arch, variant = _MACHINES.get(machine, (machine, None))
        return cls.normalized(_platform.system().lower() or "linux", arch, variant)

    def __str__(self) -> str:
        text = f"{self.os}/{self.architecture}"
        return f"{text}/{self.variant}" if self.variant else text

    def to_json(self) -> dict[str, str]:
        out = {"os": self.os, "architecture": self.architecture}
        if self.variant:
            out["variant"] = self.variant
        return out


@dataclass
class Descriptor:
    """A pointer to content: media type, digest and size (OCI descriptor)."""

    media_type: str
    digest: str
    size: int
    platform: Platform | None = None
    annotations: dict[str, str] = field(default_factory=dict)
    artifact_type: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mediaType": self.media_type,
            "digest": self.digest,
            "size": self.size,
        }
        if self.platform is not None:
            out["platform"] = self.platform.to_json()
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        if self.artifact_type:
            out["artifactType"] = self.artifact_type
        return out


def _document(media_type: str, annotations: dict[str, str], **members: Any) -> bytes:
    """A manifest or index as compact JSON: schemaVersion, mediaType, ``members`` in their
    order, then the annotations when there are any (the order fixes the digest)."""
    body: dict[str, Any] = {"schemaVersion": 2, "mediaType": media_type, **members}
    if annotations:
        body["annotations"] = dict(annotations)
    return json.dumps(body, separators=(",", ":")).encode()


@dataclass
class Manifest:
    """An image manifest (OCI or Docker schema 2)."""

    media_type: str
    config: Descriptor
    layers: list[Descriptor]
    annotations: dict[str, str] = field(default_factory=dict)
    artifact_type: str | None = None
    """Written only (an OCI 1.1 artifact such as a Sigstore bundle referrer)."""
    subject: Descriptor | None = None
    """Written only: the manifest this one refers to (OCI 1.1 referrers)."""

    def to_json(self) -> bytes:
        artifact = {"artifactType": self.artifact_type} if self.artifact_type else {}
        subject = {"subject": self.subject.to_json()} if self.subject is not None else {}
        return _document(
            self.media_type,
            self.annotations,
            **artifact,
            config=self.config.to_json(),
            layers=[layer.to_json() for layer in self.layers],
            **subject,
        )


@dataclass
class Index:
    """An image index (OCI) or manifest list (Docker)."""

    media_type: str
    manifests: list[Descriptor]
    annotations: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return _document(
            self.media_type, self.annotations, manifests=[m.to_json() for m in self.manifests]
        )


def parse_manifest(media_type: str, body: bytes, *, what: str = "manifest") -> Manifest | Index:
    """Parse and check a manifest or index body.

    ``media_type`` is the Content-Type the registry sent; when it is missing or
    generic (``application/json``) the body's own ``mediaType`` decides. The
    two must agree when both are specific. ``what`` names the thing (e.g. the
    reference) in error messages.
    """
    base_type = (media_type or "").split(";")[0].strip()
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise errors.InvalidArgument(f"{what}: the manifest is not valid JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise errors.InvalidArgument(f"{what}: the manifest is not a JSON object")
    declared = doc.get("mediaType")
    if declared is not None and not isinstance(declared, str):
        raise errors.InvalidArgument(f"{what}: the manifest's mediaType is not a string")
    if base_type in ("", "application/json", "application/octet-stream", "text/plain"):
        base_type = declared or ("" if "manifests" not in doc else mediatypes.OCI_INDEX)
        if not base_type and "layers" in doc:
            base_type = mediatypes.OCI_MANIFEST
    if doc.get("schemaVersion") == 1 or base_type in mediatypes.SCHEMA1_TYPES:
        raise errors.InvalidArgument(
            f"{what}: Docker schema 1 manifests are not supported: re-push the image with a "
            "current tool (it will be stored as schema 2 or OCI)"
        )
    known = mediatypes.INDEX_TYPES | mediatypes.MANIFEST_TYPES
    if base_type not in known:
        raise errors.InvalidArgument(
            f"{what}: media type {base_type!r} is not an image manifest or index: "
            f"expected one of {', '.join(sorted(known))}"
        )
    if declared is not None and declared != base_type:
        raise errors.InvalidArgument(
            f"{what}: the registry says the manifest is {base_type!r} but its body says "
            f"{declared!r}"
        )
    if doc.get("schemaVersion") != 2:
        raise errors.InvalidArgument(f"{what}: schemaVersion must be 2")
    annotations = _annotations(doc.get("annotations"), what)
    if base_type in mediatypes.INDEX_TYPES:
        entries = doc.get("manifests")
        if not isinstance(entries, list):
            raise errors.InvalidArgument(f"{what}: an index needs a 'manifests' list")
        return Index(
            media_type=base_type,
            manifests=[_descriptor(e, f"{what}: manifests[{i}]") for i, e in enumerate(entries)],
            annotations=annotations,
        )
    config = doc.get("config")
    layers = doc.get("layers")
    if not isinstance(config, dict):
        raise errors.InvalidArgument(f"{what}: an image manifest needs a 'config' descriptor")
    if not isinstance(layers, list):
        raise errors.InvalidArgument(f"{what}: an image manifest needs a 'layers' list")
    return Manifest(
        media_type=base_type,
        config=_descriptor(config, f"{what}: config"),
        layers=[_descriptor(layer, f"{what}: layers[{i}]") for i, layer in enumerate(layers)],
        annotations=annotations,
    )


def select_platform(index: Index, platform: Platform, *, what: str = "image") -> Descriptor:
    """The index entry that best runs on ``platform``.

    Entries must match os and architecture; among those an exact variant wins,
    then (arm) an older compatible variant, then an entry without a variant.
    NotFound lists the platforms the index offers.
    """
    wanted = Platform.normalized(platform.os, platform.architecture, platform.variant)
    best: tuple[int, int] | None = None
    chosen: Descriptor | None = None
    for position, entry in enumerate(index.manifests):
        if entry.platform is None or entry.media_type not in mediatypes.MANIFEST_TYPES:
            continue
        have = entry.platform
        if (have.os, have.architecture) != (wanted.os, wanted.architecture):
            continue
        rank = _variant_rank(wanted, have.variant)
        if rank is None:
            continue
        if best is None or (rank, position) < best:
            best, chosen = (rank, position), entry
    if chosen is None:
        offered = sorted(
            {str(e.platform) for e in index.manifests if e.platform and e.platform.os != "unknown"}
        )
        raise errors.NotFound(
            f"{what} has no manifest for platform {wanted}: it offers "
            f"{', '.join(offered) if offered else 'no platforms'}; choose one of them with the "
            "'platform' volume attribute or push an image for this platform"
        )
    return chosen


def _variant_rank(wanted: Platform, variant: str | None) -> int | None:
    """0 = exact, higher = worse, None = cannot run."""
    if wanted.variant == variant:
        return 0
    if wanted.architecture == "arm" and wanted.variant in _ARM_FALLBACK:
        order = _ARM_FALLBACK[wanted.variant]
        if variant in order:
            return order.index(variant)
    if variant is None:
        return 10
    if wanted.variant is None:
        return 5
    return None


def _descriptor(raw: Any, what: str) -> Descriptor:
    if not isinstance(raw, dict):
        raise errors.InvalidArgument(f"{what} is not a descriptor object")
    media_type = raw.get("mediaType")
    if not isinstance(media_type, str) or not media_type:
        raise errors.InvalidArgument(f"{what} has no mediaType")
    digest = raw.get("digest")
    digests.check(digest if isinstance(digest, str) else repr(digest), what=what)
    size = raw.get("size")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise errors.InvalidArgument(f"{what} has no valid size (a non-negative integer)")
    platform: Platform | None = None
    raw_platform = raw.get("platform")
    if raw_platform is not None:
        if not isinstance(raw_platform, dict):
            raise errors.InvalidArgument(f"{what}: platform is not an object")
        os_name, arch = raw_platform.get("os"), raw_platform.get("architecture")
        variant = raw_platform.get("variant")
        if not isinstance(os_name, str) or not isinstance(arch, str):
            raise errors.InvalidArgument(f"{what}: platform needs os and architecture strings")
        if variant is not None and not isinstance(variant, str):
            raise errors.InvalidArgument(f"{what}: platform variant is not a string")
        platform = Platform.normalized(os_name, arch, variant or None)
    artifact_type = raw.get("artifactType")
    return Descriptor(
        media_type=media_type,
        digest=str(digest),
        size=size,
        platform=platform,
        annotations=_annotations(raw.get("annotations"), what),
        artifact_type=artifact_type if isinstance(artifact_type, str) else None,
    )


def _annotations(raw: Any, what: str) -> dict[str, str]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in raw.items()
    ):
        raise errors.InvalidArgument(f"{what}: annotations must map strings to strings")
    return dict(raw)
