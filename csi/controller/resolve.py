"""Pinning a volume's image to a digest when the volume is created.

Where it sits: ``csi.controller.server`` calls ``pin`` in CreateVolume, before
the volume is recorded. A PV is mounted by many pods on many nodes over a long
time; if its volume context named a tag, each node would pull whatever the tag
pointed at when *it* first mounted the volume. Resolving the tag once, here,
makes every node serve the same content for one PV: the volume context carries
``image: registry/repository@sha256:...`` (the digest of the index or manifest
the tag named; each node still picks its own platform from an index).

A reference that already names a digest is content-addressed and passed on as
it is, without asking the registry. The registry is reached through a
``Resolver`` (``RegistryResolver`` in the plugin: ``rukpak.oci.client`` with the
plugin's registry settings and the caller's pull credentials); tests pass
their own against a real registry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Protocol

from rukpak.common import errors
from rukpak.oci.auth import Credentials
from rukpak.oci.client import RegistryClient
from rukpak.oci.reference import Reference
from rukpak.sources.volume import VolumeSource


class Resolver(Protocol):
    def __call__(self, ref: Reference, credentials: Credentials | None) -> str:
        """The digest ``ref`` names now (``sha256:...``); registry errors as ``errors`` values."""


class RegistryResolver:
    """Resolves tags with a short-lived ``RegistryClient`` per call (credentials differ)."""

    def __init__(self, *, insecure: Iterable[str] = (), timeout: float = 30.0) -> None:
        self.insecure = tuple(insecure)
        self.timeout = timeout

    def __call__(self, ref: Reference, credentials: Credentials | None) -> str:
        with RegistryClient(
            credentials=credentials, insecure=self.insecure, timeout=self.timeout
        ) as client:
            return client.resolve(ref).digest


def pin(source: VolumeSource, resolve: Resolver, credentials: Credentials | None) -> VolumeSource:
    """``source`` with its image named by digest (``name@sha256:...``, the tag dropped).

    Errors keep the registry's code (NotFound, Unauthenticated, Unavailable...)
    and name the image, so the PVC's ProvisioningFailed event says what to fix.
    """
    if source.fetch is not None:
        return source  # git and http volumes name their commit or digest already
    ref = Reference.parse(source.image)
    if ref.digest is not None:
        return source
    try:
        digest = resolve(ref, credentials)
    except errors.RukpakError as exc:
        hint = ""
        if isinstance(exc, errors.NotFound):
            hint = "; check the StorageClass parameter 'image' names a pushed tag"
        elif isinstance(exc, errors.Unauthenticated | errors.PermissionDenied):
            hint = (
                "; for a private image set csi.storage.k8s.io/provisioner-secret-name and "
                "-namespace in the StorageClass to a dockerconfigjson Secret"
            )
        message = f"resolving image {source.image} to a digest: {exc.message}{hint}"
        raise type(exc)(message) from None
    pinned = Reference(registry=ref.registry, repository=ref.repository).with_digest(digest)
    return dataclasses.replace(source, image=str(pinned))
