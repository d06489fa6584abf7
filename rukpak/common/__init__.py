"""Pieces every part of the project shares: errors that name a status code (without grpc),
atomic file writes, key=value logging, background chores, backoff and shared flags.

Imported by ``csi`` and ``provisioner`` alike; imports nothing of either, nor grpc.
"""
