"""Fetched bundle sources (git commits, http tarballs): resolution, fetching, the node cache.

Where it sits: the manager pins a Bundle's git or http source with ``git.resolve``
and ``http.fetch`` (digest only); the node plugin's publish core (``csi.node.publish``)
fetches the pinned content into the image cache's trees with ``cache.SourceCache``
(``ssh`` carries git over SSH with the auth Secret's key; ``auth`` reads that Secret).
"""
