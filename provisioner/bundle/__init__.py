"""Bundles as files and images: validate a bundle directory, build it into a
reproducible OCI image or layout, push it, inspect what a registry holds, and
fetch a bundle to local disk (``source``) for off-cluster use.
"""
