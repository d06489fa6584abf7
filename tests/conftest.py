"""Shared pytest configuration.

Heavy real components are session fixtures provided by plugin modules:
``tests.registry`` (Debian's docker-registry) and ``tests.cluster.fixture``
(the local Kubernetes control plane and node).
"""

pytest_plugins = ["tests.registry"]
