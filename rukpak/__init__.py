"""The shared core below both halves of RukPak.

``csi`` (the node plugin) and ``provisioner`` (the API, manager and instances) both stand
on this package; it imports neither of them, nor grpc. Inside: ``common`` (errors with a
code name, atomic files, logging, background chores, backoff), ``oci`` (the registry
client), ``image`` (fetch, verify and unpack images within budgets into content-addressed
trees) and ``sources`` (git, http and configMaps content, and the volume attributes that
name any of them). See ``docs/architecture.md``.
"""
