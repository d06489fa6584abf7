"""Pieces every part of the project shares: errors that name a status code (without grpc),
atomic file writes, key=value logging, background chores, backoff, shared flags and the
accept loop of a listening socket.

Imported by ``csi`` and ``provisioner`` alike; imports nothing of either, nor grpc.
"""
