"""What every long-running provisioner process runs on: the Lease lock and leader election
(``lease``, ``leader``), the leader-elected service loop (``service``), the work queue and
worker pool (``queue``, ``workers``), signals, the termination log and shared flags.

Used by ``provisioner.manager``, ``provisioner.storage``, ``provisioner.instance`` and the
out-of-tree provisioners (through ``provisioner.api``); imports only ``provisioner.engine``
and ``rukpak``.
"""
