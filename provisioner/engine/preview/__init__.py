"""Preview: what an install would change (the diff), without applying anything.

Part of the apply engine (``provisioner.engine``): on top of ``apply``.
"""
