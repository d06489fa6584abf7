"""The instance pod: its process (``process``) and the per-deployment Lease (``lease``)
that keeps two instances from applying at once (the manager uses the same lock).
"""
