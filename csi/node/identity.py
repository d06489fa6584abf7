"""The CSI Identity service: who the plugin is, what it serves, whether it is ready.

Where it sits: registered beside the Node (and Controller) service on the
plugin's socket by ``csi.plugin.main``; kubelet, node-driver-registrar,
livenessprobe and csi-sanity call it first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import grpc
from google.protobuf import wrappers_pb2

from csi.proto import csi_pb2, csi_pb2_grpc
from csi.rpc.errors import RpcObserver, rpc

VENDOR_VERSION = "0.1.0"


@dataclass(kw_only=True, eq=False)
class IdentityServicer(csi_pb2_grpc.IdentityServicer):
    driver_name: str
    controller: bool  # whether this process serves the Controller service too
    ready: Callable[[], bool] = lambda: True
    metrics: RpcObserver | None = None

    @rpc
    def GetPluginInfo(
        self, request: csi_pb2.GetPluginInfoRequest, context: grpc.ServicerContext
    ) -> csi_pb2.GetPluginInfoResponse:
        return csi_pb2.GetPluginInfoResponse(name=self.driver_name, vendor_version=VENDOR_VERSION)

    @rpc
    def GetPluginCapabilities(
        self, request: csi_pb2.GetPluginCapabilitiesRequest, context: grpc.ServicerContext
    ) -> csi_pb2.GetPluginCapabilitiesResponse:
        caps = []
        if self.controller:
            service = csi_pb2.PluginCapability.Service(
                type=csi_pb2.PluginCapability.Service.CONTROLLER_SERVICE
            )
            caps.append(csi_pb2.PluginCapability(service=service))
        return csi_pb2.GetPluginCapabilitiesResponse(capabilities=caps)

    @rpc
    def Probe(
        self, request: csi_pb2.ProbeRequest, context: grpc.ServicerContext
    ) -> csi_pb2.ProbeResponse:
        """Answers from memory: no lock, no I/O. It runs on a thread of its own
        (``csi.plugin.main.RPC_THREADS``), so publishes waiting on silent servers never
        hold it up, nor kubelet's liveness probe (``/healthz``) behind it."""
        return csi_pb2.ProbeResponse(ready=wrappers_pb2.BoolValue(value=self.ready()))
