"""Kubelet plugin registration: the job node-driver-registrar usually does.

Where it sits: ``csi.plugin.main`` serves this on
``<registration-dir>/<driver>-reg.sock``; kubelet's plugin watcher finds the
socket, calls GetInfo to learn the driver name and the CSI endpoint, then
reports the outcome with NotifyRegistrationStatus. A refusal is logged, counted
(``on_status`` → ``csi.plugin.metrics``) and fails ``/healthz`` (``csi.plugin.health``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import grpc

from csi.proto import pluginregistration_pb2, pluginregistration_pb2_grpc
from csi.rpc.errors import rpc

log = logging.getLogger(__name__)

PLUGIN_TYPE = "CSIPlugin"
SUPPORTED_VERSIONS = ("1.0.0",)


class RegistrationServicer(pluginregistration_pb2_grpc.RegistrationServicer):
    def __init__(
        self,
        *,
        driver_name: str,
        endpoint: str,
        on_status: Callable[[bool], object] | None = None,
    ) -> None:
        self.driver_name = driver_name
        self.endpoint = endpoint  # the CSI socket's path as kubelet sees it
        self.registered: bool | None = None  # None until kubelet reports
        self.on_status = on_status  # told every outcome (metrics, health)

    @rpc
    def GetInfo(
        self, request: pluginregistration_pb2.InfoRequest, context: grpc.ServicerContext
    ) -> pluginregistration_pb2.PluginInfo:
        return pluginregistration_pb2.PluginInfo(
            type=PLUGIN_TYPE,
            name=self.driver_name,
            endpoint=self.endpoint,
            supported_versions=list(SUPPORTED_VERSIONS),
        )

    @rpc
    def NotifyRegistrationStatus(
        self, request: pluginregistration_pb2.RegistrationStatus, context: grpc.ServicerContext
    ) -> pluginregistration_pb2.RegistrationStatusResponse:
        self.registered = request.plugin_registered
        if request.plugin_registered:
            log.info("msg=%r driver=%s", "registered with kubelet", self.driver_name)
        else:
            log.error(
                "msg=%r driver=%s endpoint=%s error=%r",
                "kubelet refused registration; /healthz fails until it accepts",
                self.driver_name,
                self.endpoint,
                request.error[:500],
            )
        if self.on_status is not None:
            self.on_status(request.plugin_registered)
        return pluginregistration_pb2.RegistrationStatusResponse()
