"""Bundle content: the formats (plain+v0, registry+v1), manifests, the bounds on what a
manifest file may cost, and upstream's words for what is wrong.

Part of the apply engine (``provisioner.engine``): pure, below ``apply``.
"""
