"""Images on local disk, for both halves: the content store, layer reading, safe
extraction, and the image cache that turns a reference into a read-only tree.

Where it sits: after ``rukpak.oci`` (the registry client) and before its users: the
node plugin (``csi.node``) publishes these trees, and ``rukpak apply IMAGE``
(``provisioner.bundle.source``) unpacks a bundle with the same code.

Modules, in flow order: ``seams`` (what the cache is given: puller, observer, pull
policy), ``cache`` (reference → tree), ``grants`` (private images re-authorised per
credential), ``cachestate`` (state.json records), ``locks`` / ``leases`` (bounded
per-key locks; what eviction must not touch), ``layerstream`` (a registry stream
teed into the store), ``store`` (content-addressed blobs), ``layerio`` (bytes → tar
members, header caps), ``extract`` (members → files, safely), ``tree`` (iterative
whole-tree walks: escape check, seal, remove).
"""
