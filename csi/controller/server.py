"""The CSI Controller service: provisioning ReadOnlyMany volumes whose content is a bundle.

Where it sits: served on the plugin socket beside Identity and Node when the
plugin runs with the controller enabled (the external-provisioner sidecar calls
it for PVCs of a StorageClass using this driver). StorageClass parameters
``image``, ``pullPolicy`` and ``platform`` are validated here and copied into
the volume context, which every node receives on NodePublishVolume. Nothing is
allocated: the reported capacity is the requested one (a bundle volume's real size
is its image's, which only a node learns). Core: ``csi.controller.volumes``.
"""

from __future__ import annotations

import dataclasses

import grpc

from csi.controller import resolve
from csi.controller.volumes import VolumeRegistry, VolumeSpec
from csi.proto import csi_pb2, csi_pb2_grpc
from csi.rpc.errors import RpcObserver, rpc
from csi.volume import access
from rukpak.common import errors
from rukpak.sources.volume import VolumeSource, credentials_from_secrets

RPC = csi_pb2.ControllerServiceCapability.RPC


def _require(request: object, *fields: str) -> None:
    """InvalidArgument naming the first of ``fields`` that ``request`` leaves empty."""
    for name in fields:
        if not getattr(request, name):
            raise errors.InvalidArgument(f"{name} is required")


class ControllerServicer(csi_pb2_grpc.ControllerServicer):
    def __init__(
        self,
        *,
        volumes: VolumeRegistry,
        resolver: resolve.Resolver,
        metrics: RpcObserver | None = None,
    ) -> None:
        self.volumes = volumes
        self.resolver = resolver
        self.metrics = metrics

    @rpc
    def CreateVolume(
        self, request: csi_pb2.CreateVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.CreateVolumeResponse:
        """Idempotent: the same name and spec returns the same volume (with the digest
        resolved the first time, without asking the registry again); else AlreadyExists."""
        _require(request, "name", "volume_capabilities")
        for capability in request.volume_capabilities:
            access.check(capability)
        if request.HasField("volume_content_source"):
            raise errors.InvalidArgument(
                "volume_content_source is not supported: a bundle volume's content is its image"
            )
        capacity = request.capacity_range
        if capacity.limit_bytes and capacity.required_bytes > capacity.limit_bytes:
            raise errors.InvalidArgument("capacity_range: required_bytes exceeds limit_bytes")
        source = VolumeSource.from_attributes(dict(request.parameters))
        spec = VolumeSpec(
            name=request.name,
            attributes=source.attributes(),
            required_bytes=capacity.required_bytes,
            limit_bytes=capacity.limit_bytes,
            modes=tuple(sorted({c.access_mode.mode for c in request.volume_capabilities})),
        )
        volume = self.volumes.existing(spec)
        if volume is None:
            credentials = credentials_from_secrets(dict(request.secrets), source)
            pinned = resolve.pin(source, self.resolver, credentials)
            volume = self.volumes.create(dataclasses.replace(spec, context=pinned.attributes()))
        return csi_pb2.CreateVolumeResponse(
            volume=csi_pb2.Volume(
                volume_id=volume.volume_id,
                capacity_bytes=capacity.required_bytes or capacity.limit_bytes,
                volume_context=volume.spec.volume_context,
            )
        )

    @rpc
    def DeleteVolume(
        self, request: csi_pb2.DeleteVolumeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.DeleteVolumeResponse:
        """Idempotent: deleting an unknown volume is OK."""
        _require(request, "volume_id")
        self.volumes.delete(request.volume_id)
        return csi_pb2.DeleteVolumeResponse()

    @rpc
    def ValidateVolumeCapabilities(
        self, request: csi_pb2.ValidateVolumeCapabilitiesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.ValidateVolumeCapabilitiesResponse:
        _require(request, "volume_id", "volume_capabilities")
        volume = self.volumes.get(request.volume_id)
        if volume is None:
            raise errors.NotFound(f"volume {request.volume_id} does not exist")
        for capability in request.volume_capabilities:
            reason = access.unsupported(capability)
            if reason is not None:
                return csi_pb2.ValidateVolumeCapabilitiesResponse(message=reason)
        if request.parameters:
            try:
                params = VolumeSource.from_attributes(dict(request.parameters)).attributes()
            except errors.InvalidArgument as exc:
                return csi_pb2.ValidateVolumeCapabilitiesResponse(message=exc.message)
            if params != volume.spec.attributes and params != volume.spec.volume_context:
                return csi_pb2.ValidateVolumeCapabilitiesResponse(
                    message="parameters differ from the volume's"
                )
        confirmed = csi_pb2.ValidateVolumeCapabilitiesResponse.Confirmed(
            volume_context=dict(request.volume_context),
            volume_capabilities=list(request.volume_capabilities),
            parameters=dict(request.parameters),
        )
        return csi_pb2.ValidateVolumeCapabilitiesResponse(confirmed=confirmed)

    @rpc
    def ControllerGetCapabilities(
        self, request: csi_pb2.ControllerGetCapabilitiesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.ControllerGetCapabilitiesResponse:
        cap = csi_pb2.ControllerServiceCapability(
            rpc=csi_pb2.ControllerServiceCapability.RPC(type=RPC.CREATE_DELETE_VOLUME)
        )
        return csi_pb2.ControllerGetCapabilitiesResponse(capabilities=[cap])
