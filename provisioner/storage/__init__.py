"""The PV provisioner role for StorageClasses naming ``csi.rukpak.io``.

What kubernetes-csi's external-provisioner sidecar does for other drivers,
written here (the sidecar is not obtainable): watch PVCs whose StorageClass
names our driver, call the Controller service's CreateVolume over the CSI
socket, create the PV bound to the claim, and on a Released PV with reclaim
policy Delete call DeleteVolume and remove the PV.

Flow: ``informer`` (list+watch caches of claims, PVs and classes) →
``controller`` (work queue, one sync per claim or PV) → ``plan`` (pure: what
to ask CreateVolume, the PV body, whether to delete, finalizers) →
``csiclient`` (the gRPC boundary) and ``events`` (what ``kubectl describe pvc``
shows). ``cli`` is the ``rukpak-provisioner volumes`` subcommand.
"""
