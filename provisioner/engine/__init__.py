"""The apply engine, one subpackage per idea:

- ``kube``: the one adapter to the Kubernetes client (``kube.kube``), discovery, schemas,
  list/watch and informers;
- ``bundle``: bundle formats (plain+v0, registry+v1), manifests, bounds on a manifest
  file, upstream's words;
- ``health``: object health and health checks;
- ``apply``: ordering, server-side apply, inventory, pruning, deletion, preflight, CRD
  upgrade safety, drift correction, ignore rules, revisions;
- ``preview``: what an install would change;

over three modules every part uses: ``objects`` (plain-dict helpers), ``errors`` and
``pool``. Everything except ``kube`` is pure and works on plain dicts and dataclasses.
``provisioner.api`` re-exports the public pieces; the instance (a standing provisioner's
run, or a run pod) and the ``rukpak apply`` CLI both drive ``apply.apply.install``. The
layers are an import contract (pyproject.toml).
"""
