"""Signed bundles: cosign-compatible signatures, the cluster's signature policies, and the
check that both halves run before content is trusted.

Where it sits: in the shared core, beside ``rukpak.oci`` (whose registry client it uses to
find and push signatures). The node plugin's publish spine (``csi.node.publish``) and the
manager's resolution of an image to a digest (``provisioner.manager``) ask a
``rukpak.signing.gate.Gate`` whether an image is allowed; the CLI signs and verifies
(``rukpak bundle sign|verify``). Modules:

- ``cosign``: cosign's storage format (tags, media types, annotations, the payload);
- ``keys``: public and private keys, PEM and cosign's encrypted format;
- ``keyless``: certificate identities under a given Fulcio root and Rekor key;
- ``policy``: ClusterBundlePolicy objects as values (selection by glob, authorities);
- ``discover``: fetching the signatures of a digest (tag scheme and OCI 1.1 referrers);
- ``verify``: one policy against those signatures; ``gate``: every policy, remembered;
- ``sign``: writing a signature as cosign does.
"""
