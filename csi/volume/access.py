"""Which volume capabilities a bundle volume can honour, for node and controller alike.

Where it sits: called by the Node servicer (publish requests) and the Controller
servicer (CreateVolume, ValidateVolumeCapabilities). Bundle content is always
served read-only through a filesystem mount. Reader-only modes are the natural
fit; single-node writer modes are accepted too, because Kubernetes uses them
for inline ephemeral volumes and ReadWriteOnce claims (and csi-sanity uses
them throughout), and the volume is then simply mounted read-only. Multi-node
writer modes and raw block access are refused.
"""

from __future__ import annotations

from csi.proto import csi_pb2
from rukpak.common import errors

Mode = csi_pb2.VolumeCapability.AccessMode

READER_MODES = frozenset({Mode.SINGLE_NODE_READER_ONLY, Mode.MULTI_NODE_READER_ONLY})
SINGLE_NODE_WRITER_MODES = frozenset(
    {Mode.SINGLE_NODE_WRITER, Mode.SINGLE_NODE_SINGLE_WRITER, Mode.SINGLE_NODE_MULTI_WRITER}
)
SUPPORTED_MODES = READER_MODES | SINGLE_NODE_WRITER_MODES


def unsupported(capability: csi_pb2.VolumeCapability) -> str | None:
    """Why ``capability`` cannot be honoured, or None when it can."""
    if capability.HasField("block"):
        return "raw block access is not supported: bundle volumes are filesystem mounts"
    if not capability.HasField("mount"):
        return "volume capability needs access_type 'mount'"
    mode = capability.access_mode.mode
    if mode not in SUPPORTED_MODES:
        name = Mode.Mode.Name(mode) if mode in Mode.Mode.values() else str(mode)
        return (
            f"access mode {name} is not supported: bundle volumes are read-only; "
            "use ReadOnlyMany (MULTI_NODE_READER_ONLY)"
        )
    return None


def check(capability: csi_pb2.VolumeCapability) -> None:
    """Raise InvalidArgument when ``capability`` cannot be honoured."""
    reason = unsupported(capability)
    if reason is not None:
        raise errors.InvalidArgument(reason)
