"""One NodePublishVolume as the node's publish core takes it, parsed and checked.

Where it sits: ``csi.node.server`` builds it from the gRPC request (attributes parsed by
``rukpak.sources.volume``, secrets by ``rukpak.oci.auth``); ``csi.node.publish`` publishes
it, and hands it to ``csi.fuse.publisher`` when the volume is published through FUSE.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rukpak.oci.auth import Credentials
from rukpak.sources.volume import VolumeSource


@dataclass(frozen=True)
class PublishRequest:
    volume_id: str
    target_path: str
    source: VolumeSource
    credentials: Credentials | None = field(default=None, repr=False)
    """From the pod's pull secrets or nodePublishSecretRef; never logged."""
