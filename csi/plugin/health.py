"""The plugin's health, as ``/healthz`` reports it: the CSI socket answers Probe, kubelet
accepted the registration.

Where it sits: built in ``csi.plugin.main`` and passed to ``csi.plugin.metrics.serve``.
A liveness check that only returned "ok" would keep a plugin whose gRPC server is
wedged, or that kubelet never registered, running forever; this one dials the CSI
socket as kubelet does and calls ``Identity.Probe``, and when the plugin serves
kubelet's registration it fails until kubelet reported the plugin registered
(``NotifyRegistrationStatus``), so a refused registration restarts the plugin. In
FUSE mode it also fails when the FUSE daemon stopped or its holder was replaced.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import grpc

from csi.proto import csi_pb2, csi_pb2_grpc

PROBE_TIMEOUT = 2.0


def probe_socket(path: Path, *, timeout: float = PROBE_TIMEOUT) -> tuple[bool, str]:
    """Call Identity.Probe on the unix socket at ``path``; (ready, reason)."""
    try:
        with grpc.insecure_channel(f"unix://{path}") as channel:
            stub = csi_pb2_grpc.IdentityStub(channel)
            answer = stub.Probe(csi_pb2.ProbeRequest(), timeout=timeout)
    except grpc.RpcError as exc:
        code = exc.code() if callable(getattr(exc, "code", None)) else None
        name = code.name if code is not None else "UNKNOWN"
        return False, f"CSI socket {path} does not answer Probe ({name})"
    if answer.HasField("ready") and not answer.ready.value:
        return False, f"CSI socket {path} answers Probe: not ready"
    return True, "ok"


def checker(
    csi_socket: Path,
    *,
    registered: Callable[[], bool | None] | None = None,
    fuse: Callable[[], bool] | None = None,
) -> Callable[[], tuple[bool, str]]:
    """The ``/healthz`` check: Probe on ``csi_socket``, then (when given) the FUSE daemon and
    its holder, then the registration."""

    def check() -> tuple[bool, str]:
        ok, reason = probe_socket(csi_socket)
        if ok and fuse is not None and not fuse():
            return False, (
                "the FUSE daemon stopped, or its holder was replaced (the fuse-holder "
                "container restarted); a plugin restart attaches to the new holder"
            )
        if not ok or registered is None:
            return ok, reason
        state = registered()
        if state is None:
            return False, "kubelet has not registered the plugin yet (no NotifyRegistrationStatus)"
        if not state:
            return False, "kubelet refused the plugin's registration; see the plugin's log"
        return True, "ok"

    return check
