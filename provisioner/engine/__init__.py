"""The apply engine: bundle formats, ordering, server-side apply, inventory,
pruning, health, drift correction and CRD upgrade safety.

Everything here except ``kube`` (the one adapter to the Kubernetes client) is
pure and works on plain dicts and dataclasses. ``provisioner.api`` re-exports
the public pieces; the instance pod and the ``rukpak apply`` CLI both drive
``apply.install``.
"""
