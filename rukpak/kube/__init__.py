"""Following the Kubernetes API, shared by the node plugin and the provisioner.

``listwatch`` is the one list+watch (client-go's reflector and informer, kept small) over any
``listwatch.Source``: the provisioner's own HTTP adapter (``provisioner.engine.kube.Kube``)
and the official client for the node plugin (``csi.node.apisource.ClientSource``).
"""
