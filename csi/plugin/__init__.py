"""The ``rukpak-csi-plugin`` process: flags, wiring of the Identity, Node and Controller
services and kubelet registration onto sockets, metrics (``metrics``) and the health
endpoint (``health``: Probe over the CSI socket, kubelet registration accepted).

The top of the CSI half: it imports ``csi.node`` and ``csi.controller``; nothing
imports it.
"""
