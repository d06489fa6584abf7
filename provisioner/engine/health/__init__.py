"""Health: when an installed object reports ready, and user-defined health checks.

Part of the apply engine (``provisioner.engine``): pure, below ``apply``.
"""
