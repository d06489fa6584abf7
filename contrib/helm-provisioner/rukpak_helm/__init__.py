"""The helm provisioner: renders helm charts from Bundles of class ``core-rukpak-io-helm``
with values from their BundleDeployment's ``spec.config.values`` and installs the result
with RukPak's apply engine. Built only on ``provisioner.api``; see
docs/writing-a-provisioner.md."""
