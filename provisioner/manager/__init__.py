"""The manager (DESIGN.md "Manager"): BundleDeployment -> generated Bundle -> instance.

``model`` (names, labels), ``build`` (generated objects), ``plan`` (pure
planner), ``actuate`` (the only writer), ``queue`` (work queue),
``controller`` (watch + reconcile loop), ``cli`` (``rukpak-provisioner manager``).
"""
