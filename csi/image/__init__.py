"""Images on local disk, for both halves: the content store, layer reading, safe
extraction, and the image cache that turns a reference into a read-only tree.

Where it sits: after ``csi.oci`` (the registry client) and before its users: the
node plugin (``csi.node``) publishes these trees, and ``rukpak apply IMAGE``
(``provisioner.bundle.source``) unpacks a bundle with the same code.
"""
