"""What a bundle volume is, shared by the Node and Controller services: the access modes it
honours (``access``) and a publish request as the node's services pass it on (``request``).
Its attributes are parsed by ``rukpak.sources.volume``.
"""
