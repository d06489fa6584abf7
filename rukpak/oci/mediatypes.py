"""Media types of the OCI image spec and Docker's schema 2, in one place.

The puller (``rukpak.oci.client``) sends ``MANIFEST_ACCEPT`` when it asks for a
manifest, ``rukpak.oci.manifest`` decides from these names whether a body is an
index or an image manifest, and the extractor picks a decompressor from the
layer table (:data:`LAYER_COMPRESSION`). The manifest and index strings are taken
from ``oras.defaults`` (the dependency already names them) so the two never disagree.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

import oras.defaults

# Manifests and indexes.
OCI_INDEX: Final[str] = oras.defaults.default_index_media_type
OCI_MANIFEST: Final[str] = oras.defaults.default_manifest_media_type
DOCKER_LIST: Final[str] = oras.defaults.docker_manifest_list_media_type
DOCKER_MANIFEST: Final[str] = oras.defaults.docker_manifest_media_type
DOCKER_MANIFEST_V1_SIGNED: Final[str] = "application/vnd.docker.distribution.manifest.v1+prettyjws"
DOCKER_MANIFEST_V1: Final[str] = "application/vnd.docker.distribution.manifest.v1+json"

# Configs.
OCI_CONFIG: Final[str] = "application/vnd.oci.image.config.v1+json"
DOCKER_CONFIG: Final[str] = "application/vnd.docker.container.image.v1+json"
OCI_EMPTY: Final[str] = "application/vnd.oci.empty.v1+json"

# Layers.
OCI_LAYER_TAR: Final[str] = "application/vnd.oci.image.layer.v1.tar"
OCI_LAYER_GZIP: Final[str] = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_LAYER_ZSTD: Final[str] = "application/vnd.oci.image.layer.v1.tar+zstd"
OCI_LAYER_NONDIST_TAR: Final[str] = "application/vnd.oci.image.layer.nondistributable.v1.tar"
OCI_LAYER_NONDIST_GZIP: Final[str] = "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
OCI_LAYER_NONDIST_ZSTD: Final[str] = "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd"
DOCKER_LAYER_GZIP: Final[str] = "application/vnd.docker.image.rootfs.diff.tar.gzip"
DOCKER_LAYER_FOREIGN_GZIP: Final[str] = "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip"
HELM_CHART_CONTENT: Final[str] = "application/vnd.cncf.helm.chart.content.v1.tar+gzip"
"""A Helm chart pushed as an OCI artifact (``helm push``): its ``.tgz``, a gzip tar, so a
volume presents the chart unpacked (``<chart>/Chart.yaml``)."""

INDEX_TYPES: Final[frozenset[str]] = frozenset({OCI_INDEX, DOCKER_LIST})
MANIFEST_TYPES: Final[frozenset[str]] = frozenset({OCI_MANIFEST, DOCKER_MANIFEST})
SCHEMA1_TYPES: Final[frozenset[str]] = frozenset({DOCKER_MANIFEST_V1, DOCKER_MANIFEST_V1_SIGNED})

# What the client sends as Accept when it asks for a manifest: all four types a
# modern registry may hold, most specific first.
MANIFEST_ACCEPT: Final[tuple[str, ...]] = (OCI_INDEX, OCI_MANIFEST, DOCKER_LIST, DOCKER_MANIFEST)

# The one table of filesystem layer media types: each type → how its bytes are
# compressed ("none", "gzip" or "zstd"). ``rukpak.image.layerio`` maps a compression
# to its decompressor; everything that asks "is this a layer?" uses LAYER_TYPES.
NO_COMPRESSION: Final[str] = "none"
GZIP: Final[str] = "gzip"
ZSTD: Final[str] = "zstd"
LAYER_COMPRESSION: Final[Mapping[str, str]] = MappingProxyType(
    {
        OCI_LAYER_TAR: NO_COMPRESSION,
        OCI_LAYER_NONDIST_TAR: NO_COMPRESSION,
        OCI_LAYER_GZIP: GZIP,
        OCI_LAYER_NONDIST_GZIP: GZIP,
        DOCKER_LAYER_GZIP: GZIP,
        DOCKER_LAYER_FOREIGN_GZIP: GZIP,
        HELM_CHART_CONTENT: GZIP,
        OCI_LAYER_ZSTD: ZSTD,
        OCI_LAYER_NONDIST_ZSTD: ZSTD,
    }
)
LAYER_TYPES: Final[frozenset[str]] = frozenset(LAYER_COMPRESSION)
