"""The content digest a pinned source names: what an approval of a preview is bound to.

Where it sits: a pin (a BundleDeployment's ``status.resolvedSource``, one per source) names
its content exactly: an image by digest (``ref@sha256:<hex>``), an http tarball by the
``#sha256=<hex>`` fragment ``http.fetch`` pins it with, a git repository by commit. The
manager (``provisioner.manager.planning.approval``) records these digests beside a preview, and
``rukpak approve`` (``provisioner.cli.approve``) checks the one a user names against them:
both read a pin's digest here, so they agree on what counts as the same content.
"""

from __future__ import annotations

import re

_IMAGE_DIGEST = re.compile(r"@(sha256:[0-9a-f]{64}|sha512:[0-9a-f]{128})$")
_HTTP_PIN = re.compile(r"#sha256=([0-9a-f]{64})$")


def content_digest(body: object) -> str | None:
    """The digest the body of a pinned source (``pin[pin["type"]]``) names: an image
    digest, ``sha256:<hex>`` of an http tarball, a git commit; None when it names none
    (a ConfigMap source, or a pin that is not one)."""
    if not isinstance(body, dict):
        return None
    ref = body.get("ref")
    image = _IMAGE_DIGEST.search(ref) if isinstance(ref, str) else None
    if image:
        return image.group(1)
    http = _HTTP_PIN.search(str(body.get("url") or ""))
    if http:
        return f"sha256:{http.group(1)}"
    commit = ref.get("commit") if isinstance(ref, dict) else None
    return commit if isinstance(commit, str) and commit else None
