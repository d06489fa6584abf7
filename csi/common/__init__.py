"""Pieces every part of the project shares: errors with gRPC codes, the decorator that
turns them into statuses, key=value logging with secrets redacted, and atomic file writes.

Imported by ``csi`` and ``provisioner`` alike; imports nothing of either.
"""
