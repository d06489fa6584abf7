"""RukPak on a kind cluster, built offline: the Docker engine from Debian, the kind CLI
from its Go module, a node image made here from Debian packages and the Kubernetes
binaries of ``tests/cluster``.

Where it sits: beside ``tests.cluster`` (the project's own local cluster), used by
``make kind-run`` / ``make kind-down`` (``hack/run.sh`` with ``CLUSTER=kind``) and by the
``kind``-marked tests. Modules:

- ``engine``: a Docker engine that answers (the user's, or ``dockerd`` started here);
- ``ociarchive``: one-layer images of our binaries as an OCI archive for ``ctr import``;
- ``nodeimage``: the node image (``rukpak-kind-node:<kubernetes version>``), cached;
- ``cluster``: the kind cluster, its registries and its kubeconfig; ``__main__``: the CLI.
"""
