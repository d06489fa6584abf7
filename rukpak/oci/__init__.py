"""OCI distribution client: how bundle images get from a registry to a node.

Modules, in the order a pull uses them:

- ``reference``: parse ``[registry/]repository[:tag][@digest]`` like Docker.
- ``auth``: pull-secret credentials, ``WWW-Authenticate`` challenges, bearer tokens.
- ``transport``: the network seam (scheme choice, timeouts, retries, auth, error codes).
- ``client``: ``RegistryClient`` (resolve, manifests, platform selection, blobs).
- ``manifest`` / ``mediatypes``: manifest and index shapes, platforms.
- ``digest`` / ``blobio``: digest checks and verified, atomic writes.
- ``upload``: pushing blobs and manifests (tests, CLI).
"""
