"""The kube adapter and informers: the one client of the Kubernetes API (``kube``),
discovery, schemas, and list/watch caches.

Part of the apply engine (``provisioner.engine``): below ``apply`` and ``preview``.
"""
