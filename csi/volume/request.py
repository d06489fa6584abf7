"""One NodePublishVolume as the node's publish core takes it, parsed and checked.

Where it sits: ``csi.node.server`` builds it from the gRPC request (attributes parsed by
``rukpak.sources.volume``, secrets by ``rukpak.oci.auth``); ``csi.node.publish`` publishes
it, and hands it to ``csi.fuse.publisher`` when the volume is published through FUSE.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from rukpak.oci.auth import Credentials
from rukpak.sources.volume import VolumeSource

POD_NAMESPACE = "csi.storage.k8s.io/pod.namespace"
POD_NAME = "csi.storage.k8s.io/pod.name"
POD_UID = "csi.storage.k8s.io/pod.uid"


@dataclass(frozen=True)
class PodRef:
    """The pod a volume is published for, from the attributes kubelet adds with
    ``podInfoOnMount`` (the CSIDriver object sets it): where events about it go."""

    namespace: str
    name: str
    uid: str = ""

    @classmethod
    def from_attributes(cls, attributes: Mapping[str, str]) -> PodRef | None:
        """None when kubelet did not say which pod (no podInfoOnMount)."""
        namespace = attributes.get(POD_NAMESPACE, "").strip()
        name = attributes.get(POD_NAME, "").strip()
        if not namespace or not name:
            return None
        return cls(namespace, name, attributes.get(POD_UID, "").strip())

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class PublishRequest:
    """A NodePublishVolume request once its attributes parse: what the publisher
    (``csi.node.publish``) is handed, never the gRPC message itself."""

    volume_id: str
    target_path: str
    source: VolumeSource
    credentials: Credentials | None = field(default=None, repr=False)
    """From the pod's pull secrets or nodePublishSecretRef; never logged."""
    pod: PodRef | None = None
    """Who the volume is for (events about its signature check); None: not said."""
