"""The gRPC edge of the node plugin: ``errors`` turns the core's coded errors into
statuses (one decorator per RPC, with its observer), ``redact`` keeps fields the CSI spec
marks ``csi_secret`` out of every log line.

Used by the servicers in ``csi.node`` and ``csi.controller``; imports only ``csi.proto``
and ``rukpak.common``.
"""
