"""Bundle sources: which ``spec.source`` types the manager handles, and how a pinned one
reaches a pod.

Sits under both planners (``bundleplan`` for Bundles, ``plan`` for
BundleDeployments) and ``generate`` (the pods): ``unsupported(source)`` says
why a source cannot be handled (None when it can); ``pinned(bundle)`` is the
Bundle's ``status.resolvedSource`` once the Bundle controller pinned it
(an image digest), None before; ``volume(resolved)`` is the read-only pod
volume named ``bundle`` that carries that exact content to the unpack pod and
the instance pod. Bundle content never passes through etcd or logs: it
reaches pods only as this volume.
"""

from __future__ import annotations

from typing import Any

from provisioner.engine.objects import Obj

VOLUME_NAME = "bundle"
CSI_DRIVER = "csi.rukpak.io"
SUPPORTED = ("image",)


def unsupported(source: Obj) -> str | None:
    """Why ``source`` cannot be unpacked here, in upstream's words; None when it can."""
    kind = source.get("type")
    if kind in SUPPORTED:
        return None
    return f'source bundle content: bundle source type "{kind}" not supported'


def pinned(bundle: Obj) -> Obj | None:
    """The Bundle's ``status.resolvedSource`` when it is pinned, else None."""
    resolved: Any = (bundle.get("status") or {}).get("resolvedSource")
    if not isinstance(resolved, dict):
        return None
    if resolved.get("type") == "image" and (resolved.get("image") or {}).get("ref"):
        return resolved
    return None


def pinned_image(ref: str) -> Obj:
    """The ``resolvedSource`` of an image pinned by digest."""
    return {"type": "image", "image": {"ref": ref}}


def describe(resolved: Obj) -> str:
    """The pinned content in a few words (logs, messages)."""
    if resolved.get("type") == "image":
        return str((resolved.get("image") or {}).get("ref") or "")
    return str(resolved.get("type") or "")


def volume(resolved: Obj) -> Obj:
    """The read-only pod volume ``bundle`` holding the pinned content."""
    if resolved.get("type") == "image":
        ref = str((resolved.get("image") or {}).get("ref") or "")
        return {
            "name": VOLUME_NAME,
            "csi": {
                "driver": CSI_DRIVER,
                "readOnly": True,
                "volumeAttributes": {"image": ref, "pullPolicy": "IfNotPresent"},
            },
        }
    raise ValueError(f"no volume for source type {resolved.get('type')!r}")
