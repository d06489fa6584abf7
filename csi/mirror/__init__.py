"""The registry mirror (``python -m csi.mirror``): see ``csi.mirror.server``."""
