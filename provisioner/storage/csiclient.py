"""The CSI boundary of the provisioner role: Identity and Controller calls over the unix socket.

Where it sits: ``provisioner.storage.controller`` calls ``create_volume`` and
``delete_volume``; at start ``connect`` waits for the plugin's socket and checks,
as the external-provisioner sidecar does, that the plugin names the driver
expected and offers the Controller service with CREATE_DELETE_VOLUME. Calls carry
a deadline; failures come back as ``CsiError`` holding the gRPC code and the
plugin's message (the text of the claim's ProvisioningFailed event). ``observe``, when set,
hears of every Create/DeleteVolume call (method, gRPC code name, seconds): the
provisioner's ``csi_sidecar_operations_seconds``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import NoReturn

import grpc

from csi.proto import csi_pb2, csi_pb2_grpc
from provisioner.storage.plan import Capability, CreatedVolume, CreateRequest
from rukpak.common import errors

log = logging.getLogger(__name__)

Mode = csi_pb2.VolumeCapability.AccessMode.Mode
_PLUGIN_CAPS = csi_pb2.GetPluginCapabilitiesRequest()
_CONTROLLER_CAPS = csi_pb2.ControllerGetCapabilitiesRequest()
_CONTROLLER_SERVICE = csi_pb2.PluginCapability.Service.CONTROLLER_SERVICE
_CREATE_DELETE_VOLUME = csi_pb2.ControllerServiceCapability.RPC.CREATE_DELETE_VOLUME


class CsiError(errors.RukpakError):
    """A failed CSI call: ``status`` is the gRPC code; str() reads like the sidecar's events
    (``rpc error: code = InvalidArgument desc = ...``)."""

    def __init__(self, status: grpc.StatusCode, details: str) -> None:
        self.status = status
        self.details = details
        name = "".join(part.capitalize() for part in status.name.split("_"))
        super().__init__(f"rpc error: code = {name} desc = {details}")
        self.code = status.name


def _capability(cap: Capability) -> csi_pb2.VolumeCapability:
    mode = csi_pb2.VolumeCapability.AccessMode(mode=cap.mode)
    if cap.block:
        return csi_pb2.VolumeCapability(
            block=csi_pb2.VolumeCapability.BlockVolume(), access_mode=mode
        )
    mount = csi_pb2.VolumeCapability.MountVolume(fs_type=cap.fs_type, mount_flags=cap.mount_flags)
    return csi_pb2.VolumeCapability(mount=mount, access_mode=mode)


def _failed(err: grpc.RpcError) -> CsiError:
    code = err.code() if hasattr(err, "code") else grpc.StatusCode.UNKNOWN
    details = err.details() if hasattr(err, "details") else str(err)
    return CsiError(code, details or "")


class CsiClient:
    """One channel to the plugin's socket, shared by the workers (gRPC channels are)."""

    def __init__(self, address: str, *, timeout: float = 60.0) -> None:
        target = address if address.startswith("unix:") else f"unix://{address}"
        self.address = target
        self.timeout = timeout
        self._channel = grpc.insecure_channel(target)
        self._identity = csi_pb2_grpc.IdentityStub(self._channel)
        self._controller = csi_pb2_grpc.ControllerStub(self._channel)
        self.observe: Callable[[str, str, float], None] = lambda method, code, seconds: None

    def close(self) -> None:
        self._channel.close()

    def connect(self, *, driver: str | None, wait: float) -> str:
        """Wait up to ``wait`` seconds for the plugin; return its driver name.

        FailedPrecondition when it names another driver than ``driver`` or lacks
        the Controller service or CREATE_DELETE_VOLUME; Unavailable when it never
        answers.
        """
        deadline = time.monotonic() + wait
        while True:
            try:
                info = self._identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest(), timeout=5)
                break
            except grpc.RpcError as err:
                if time.monotonic() >= deadline:
                    raise errors.Unavailable(
                        f"the CSI plugin at {self.address} does not answer ({_failed(err)}); "
                        "check the plugin container is running and shares the socket volume"
                    ) from None
                log.info("msg=%r address=%s error=%r", "waiting for the CSI plugin",
                         self.address, str(_failed(err)))  # fmt: skip
                time.sleep(1.0)
        if driver and info.name != driver:
            self._refuse(f"is driver {info.name!r}, not {driver!r}")
        services = self._identity.GetPluginCapabilities(_PLUGIN_CAPS, timeout=10).capabilities
        if not any(c.service.type == _CONTROLLER_SERVICE for c in services):
            self._refuse("does not offer the Controller service; start it with --controller")
        rpcs = self._controller.ControllerGetCapabilities(_CONTROLLER_CAPS, timeout=10).capabilities
        if not any(c.rpc.type == _CREATE_DELETE_VOLUME for c in rpcs):
            self._refuse("does not advertise CREATE_DELETE_VOLUME")
        return str(info.name)

    def _refuse(self, why: str) -> NoReturn:
        """The plugin cannot serve this provisioner: FailedPrecondition naming it and ``why``."""
        raise errors.FailedPrecondition(f"the CSI plugin at {self.address} {why}")

    def create_volume(self, request: CreateRequest, secrets: dict[str, str]) -> CreatedVolume:
        message = csi_pb2.CreateVolumeRequest(
            name=request.name,
            capacity_range=csi_pb2.CapacityRange(required_bytes=request.required_bytes),
            volume_capabilities=[_capability(c) for c in request.capabilities],
            parameters=request.parameters,
            secrets=secrets,
        )
        start = time.monotonic()
        try:
            response = self._controller.CreateVolume(message, timeout=self.timeout)
        except grpc.RpcError as err:
            failed = _failed(err)
            self.observe("CreateVolume", failed.code, time.monotonic() - start)
            raise failed from None
        self.observe("CreateVolume", "OK", time.monotonic() - start)
        volume = response.volume
        return CreatedVolume(
            volume_id=volume.volume_id,
            capacity_bytes=volume.capacity_bytes,
            volume_context=dict(volume.volume_context),
        )

    def delete_volume(self, volume_id: str, secrets: dict[str, str]) -> None:
        message = csi_pb2.DeleteVolumeRequest(volume_id=volume_id, secrets=secrets)
        start = time.monotonic()
        try:
            self._controller.DeleteVolume(message, timeout=self.timeout)
        except grpc.RpcError as err:
            failed = _failed(err)
            self.observe("DeleteVolume", failed.code, time.monotonic() - start)
            raise failed from None
        self.observe("DeleteVolume", "OK", time.monotonic() - start)
