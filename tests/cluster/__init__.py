"""A real single-node Kubernetes for tests and ``make run``, built from upstream sources.

``build.sh`` compiles etcd, the control plane, the kubelet, kubectl and csi-sanity from
the Go module proxy into a cache; ``localcluster`` starts them on loopback in a temporary
directory (with containerd and a local registry holding the pause and busybox images);
``fixture`` exposes them to pytest; ``python -m tests.cluster up|down|status`` to people.
"""
