"""The manager (DESIGN.md "Manager"): Bundles, BundleDeployments, the CRD webhook.

``model`` (names, labels), ``generate`` (generated Bundles, unpack pods, instance
Deployments), ``bundleplan`` and ``plan`` (pure planners for a Bundle and a
BundleDeployment), ``actuate`` (the only writer), ``queue`` (work queue),
``healthwatch`` (Healthy from watches), ``controller`` (informers + reconcile loop),
``unpack`` (``rukpak-provisioner unpack``, the unpack pod's process), ``webhook``
and ``certs`` (the CRD upgrade-safety admission webhook and its certificate),
``cli`` (``rukpak-provisioner manager``).
"""
