"""The node plugin's container image for tests: built by ``hack/image/build.sh`` (no
container engine; cached under ``${RUKPAK_CACHE:-~/.cache/rukpak}/image``), pushed to
the registry the test cluster's containerd pulls from.

Where it sits: ``tests/test_e2e_daemonset.py`` deploys ``daemonset/`` with this image.
A first build takes a minute or two (debootstrap, dependency wheels); later ones only
re-layer the project's wheel when its sources changed, and reuse everything otherwise.
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
BUILD_SH = REPO_ROOT / "hack" / "image" / "build.sh"


def build_and_push(
    ref: str,
    *,
    request: pytest.FixtureRequest | None = None,
    timeout: float = 1200,
    insecure: tuple[str, ...] = (),
) -> str:
    """Build the image (cached) and push it as ``ref``; return ``repository@digest``.

    With ``request``, the build's progress goes straight to the terminal (past pytest's
    output capture), as the cluster fixture does for its first build. ``insecure`` are
    registries (host:port) spoken to over plain HTTP although not on loopback.
    """
    flags = [a for host in insecure for a in ("--insecure", host)]
    capture = request.config.pluginmanager.getplugin("capturemanager") if request else None
    with tempfile.TemporaryDirectory(prefix="rk-image-") as tmp:
        digest_file = Path(tmp) / "digest"
        log = Path(tmp) / "build.log"
        shown = capture.global_and_fixture_disabled() if capture else contextlib.nullcontext()
        with shown:
            if capture:
                print(f"\nbuilding the node plugin image ({BUILD_SH.relative_to(REPO_ROOT)})")
                done = subprocess.run(
                    ["bash", str(BUILD_SH), *flags, "--digest-file", str(digest_file), ref],
                    timeout=timeout,
                    check=False,
                )
            else:
                with log.open("wb") as out:
                    done = subprocess.run(
                        ["bash", str(BUILD_SH), *flags, "--digest-file", str(digest_file), ref],
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        timeout=timeout,
                        check=False,
                    )
        if done.returncode != 0:
            tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
            raise RuntimeError(f"{BUILD_SH} {ref} failed (exit {done.returncode})\n{tail}")
        digest = digest_file.read_text().strip()
    repository = ref.rsplit(":", 1)[0] if ref.rfind(":") > ref.rfind("/") else ref
    return f"{repository}@{digest}"
