"""The CSI Node service: the gRPC edge of ``csi.node.publish``.

Where it sits: registered on the plugin's unix socket by ``csi.plugin.main``.
Each RPC validates its request, calls the publish core with plain dataclasses
and builds the response; errors are ``rukpak.common.errors`` values turned into gRPC
statuses by ``csi.rpc.errors.rpc``. NodeStage/NodeUnstage are not advertised
and answer UNIMPLEMENTED (inherited from the generated base class).

An image volume with its own registry TLS (``certificateData``, ``insecureSkipTLSVerify``)
is published under that trust on the RPC's thread only (``rukpak.oci.tls.using``): the
clients made for it take it, a concurrent publish of another volume never does. Such a
volume is published in bind mode (fetched whole within the publish), never through FUSE,
whose lazy reads run later on threads that do not carry one volume's trust.

NodePublishVolume's deadline starts when the request arrives: ``--publish-deadline``,
or less when the client's own gRPC deadline (kubelet's 2 minutes) comes sooner.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TypeVar

import grpc

from csi.node.publish import Publisher
from csi.node.refresh import RefreshVolumes
from csi.node.storevolume import PodInfo, StoreVolumes
from csi.proto import csi_pb2, csi_pb2_grpc
from csi.rpc.errors import RpcObserver, rpc
from csi.volume import access
from csi.volume.request import PodRef, PublishRequest
from rukpak.common import errors
from rukpak.oci import tls as source_tls
from rukpak.sources import volume
from rukpak.sources.volume import VolumeSource, credentials_from_secrets

# Failures that depend on where the plugin runs (its network, its clock); the message
# names the node, as kubelet's event does not say which node's plugin answered.
NODE_LOCAL = (errors.Unavailable, errors.DeadlineExceeded)

_Volumes = TypeVar("_Volumes", StoreVolumes, RefreshVolumes)


def _require(volume_id: str, target_path: str) -> None:
    """Both publish and unpublish name the volume and the target path."""
    if not volume_id:
        raise errors.InvalidArgument("volume_id is required")
    if not target_path:
        raise errors.InvalidArgument("target_path is required")


def _served(volumes: _Volumes | None, kind: str, *, without: str) -> _Volumes:
    """The ``kind`` volumes this plugin serves; FAILED_PRECONDITION when it was started
    ``without`` their root (None)."""
    if volumes is None:
        raise errors.FailedPrecondition(
            f"{kind} volumes are not served by this node plugin (it was started without {without})"
        )
    return volumes


@dataclass(kw_only=True, eq=False)
class NodeServicer(csi_pb2_grpc.NodeServicer):
    """NodePublishVolume / NodeUnpublishVolume / NodeGetInfo / NodeGetCapabilities."""

    publisher: Publisher
    node_id: str
    metrics: RpcObserver | None = None
    store: StoreVolumes | None = None
    refresh: RefreshVolumes | None = None
    """Store volumes (``kind: store``, ``csi.node.storevolume``); None: refused."""

    @rpc
    def NodePublishVolume(
        self, request: csi_pb2.NodePublishVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodePublishVolumeResponse:
        """Idempotent: the same volume and image on the same target again is OK."""
        _require(request.volume_id, request.target_path)
        if not request.HasField("volume_capability"):
            raise errors.InvalidArgument("volume_capability is required")
        access.check(request.volume_capability)
        attributes = dict(request.volume_context)
        if volume.volume_kind(attributes) == volume.KIND_STORE:
            _served(self.store, "store", without="a store volume root").publish(
                request.volume_id, request.target_path, PodInfo.from_attributes(attributes)
            )
            return csi_pb2.NodePublishVolumeResponse()
        secrets = dict(request.secrets)
        source = VolumeSource.from_attributes(attributes).with_secrets(secrets)
        if source.refresh:
            _served(self.refresh, "refresh", without="a view root").publish(
                request.volume_id,
                request.target_path,
                source,
                credentials_from_secrets(secrets, source),
                PodRef.from_attributes(attributes),
            )
            return csi_pb2.NodePublishVolumeResponse()
        if source.tls is not None and source.publish_mode != "bind":
            source = dataclasses.replace(source, publish_mode="bind")  # see the docstring
        deadline = self.publisher.deadline(context.time_remaining())
        try:
            with source_tls.using(source.tls):  # this volume's registry trust, this thread only
                self.publisher.publish(
                    PublishRequest(
                        volume_id=request.volume_id,
                        target_path=request.target_path,
                        source=source,
                        credentials=credentials_from_secrets(secrets, source),
                        pod=PodRef.from_attributes(attributes),
                    ),
                    deadline=deadline,
                )
        except NODE_LOCAL as e:
            # a source this node cannot reach may answer others: say which node asked
            raise type(e)(f"{e} (from node {self.node_id})") from e
        return csi_pb2.NodePublishVolumeResponse()

    @rpc
    def NodeUnpublishVolume(
        self, request: csi_pb2.NodeUnpublishVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeUnpublishVolumeResponse:
        """Idempotent: an unknown or already removed target is OK."""
        _require(request.volume_id, request.target_path)
        if self.store is not None and self.store.is_store(request.target_path):
            self.store.unpublish(request.volume_id, request.target_path)
        if self.refresh is not None and self.refresh.is_refresh(request.target_path):
            self.refresh.unpublish(request.volume_id, request.target_path)
        self.publisher.unpublish(request.volume_id, request.target_path)
        return csi_pb2.NodeUnpublishVolumeResponse()

    @rpc
    def NodeGetCapabilities(
        self, request: csi_pb2.NodeGetCapabilitiesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeGetCapabilitiesResponse:
        return csi_pb2.NodeGetCapabilitiesResponse()

    @rpc
    def NodeGetInfo(
        self, request: csi_pb2.NodeGetInfoRequest, context: grpc.ServicerContext
    ) -> csi_pb2.NodeGetInfoResponse:
        return csi_pb2.NodeGetInfoResponse(node_id=self.node_id, max_volumes_per_node=0)
