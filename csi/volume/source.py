"""A bundle volume's source: the volume attributes (inline ``volumeAttributes``,
StorageClass parameters or PV ``volumeAttributes``) parsed into a ``VolumeSource``,
and pull credentials from the publish secret.

Where it sits: the Node service parses publish requests with it and the
Controller service checks CreateVolume parameters with it; both then hand the
plain dataclass on (to ``csi.node.publish`` or the volume records).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from csi.common import errors
from csi.image.seams import PullPolicy
from csi.oci.auth import Credentials
from csi.oci.manifest import Platform
from csi.oci.reference import Reference

ATTR_IMAGE = "image"
ATTR_PULL_POLICY = "pullPolicy"
ATTR_PLATFORM = "platform"
ATTR_PUBLISH_MODE = "publishMode"
PUBLISH_MODES = ("bind", "fuse")
KNOWN_ATTRIBUTES = (ATTR_IMAGE, ATTR_PULL_POLICY, ATTR_PLATFORM, ATTR_PUBLISH_MODE)
# Added by Kubernetes (podInfoOnMount, ephemeral flag, provisioner metadata).
K8S_ATTRIBUTE_PREFIX = "csi.storage.k8s.io/"
SECRET_KEYS = (".dockerconfigjson", ".dockercfg")


@dataclass(frozen=True)
class VolumeSource:
    """What a volume holds: an image, how to pull it, and for which platform."""

    image: str
    pull_policy: PullPolicy = PullPolicy.IF_NOT_PRESENT
    platform: Platform | None = None
    publish_mode: str | None = None  # bind | fuse; None: the plugin's --publish-mode

    @classmethod
    def from_attributes(cls, attributes: Mapping[str, str]) -> VolumeSource:
        """Parse volume attributes (or StorageClass parameters); InvalidArgument if wrong."""
        unknown = sorted(
            k
            for k in attributes
            if k not in KNOWN_ATTRIBUTES and not k.startswith(K8S_ATTRIBUTE_PREFIX)
        )
        if unknown:
            raise errors.InvalidArgument(
                f"unknown volume attribute(s) {', '.join(unknown)}; "
                f"supported: {', '.join(KNOWN_ATTRIBUTES)}"
            )
        image = attributes.get(ATTR_IMAGE, "").strip()
        if not image:
            raise errors.InvalidArgument(
                "volume attribute 'image' is required: set it to the bundle image reference, "
                "e.g. quay.io/org/bundle:v1"
            )
        Reference.parse(image)
        policy = PullPolicy.parse(attributes.get(ATTR_PULL_POLICY) or "IfNotPresent")
        platform_text = attributes.get(ATTR_PLATFORM, "").strip()
        platform = Platform.parse(platform_text) if platform_text else None
        mode = attributes.get(ATTR_PUBLISH_MODE, "").strip() or None
        if mode is not None and mode not in PUBLISH_MODES:
            raise errors.InvalidArgument(
                f"publishMode {mode!r} is invalid: use bind or fuse (or leave it unset for the "
                "plugin's default)"
            )
        return cls(image=image, pull_policy=policy, platform=platform, publish_mode=mode)

    def attributes(self) -> dict[str, str]:
        out = {ATTR_IMAGE: self.image, ATTR_PULL_POLICY: self.pull_policy.value}
        if self.platform is not None:
            out[ATTR_PLATFORM] = str(self.platform)
        if self.publish_mode is not None:
            out[ATTR_PUBLISH_MODE] = self.publish_mode
        return out


def credentials_from_secrets(secrets: Mapping[str, str]) -> Credentials | None:
    """Pull credentials from a dockerconfigjson Secret's data; None when there is none."""
    if not secrets:
        return None
    for key in SECRET_KEYS:
        if key in secrets:
            return Credentials.from_dockerconfigjson(secrets[key])
    raise errors.InvalidArgument(
        "the publish secret has no '.dockerconfigjson' key: use a Secret of type "
        "kubernetes.io/dockerconfigjson (kubectl create secret docker-registry)"
    )
