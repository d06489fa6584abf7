"""Applying a bundle: ordering, server-side apply, inventory and pruning, deletion,
preflight and CRD upgrade safety, drift correction and its damper, ignore rules.

Part of the apply engine (``provisioner.engine``): above ``kube``, ``bundle`` and
``health``; ``preview`` builds on it.
"""
