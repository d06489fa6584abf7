"""The ``rukpak-csi-plugin`` process: flags, wiring of the Identity, Node and Controller
services and kubelet registration onto sockets, metrics and the health endpoint.

The top of the CSI half: it imports ``csi.node`` and ``csi.controller``; nothing
imports it.
"""
