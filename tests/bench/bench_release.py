"""What a release costs: ``make release`` on a warm cache, image size per architecture, and
``pip install`` of the CLI wheel into a new venv.

Where it sits: ``python -m tests.bench release`` (``make bench``). Runs
``hack/release/release.sh`` for ``ARCHES`` (default both, amd64 and arm64, as ``make
release`` does) into the work directory twice: the first run fills whatever cache is cold
(base layers, the app layer of this tree, kustomize and helm), the second is the figure
(goal: at most 5 minutes). Sizes are the compressed layers of each image in the index
(goal: below 121 MB, the amd64 image before releases). The wheel goes into a new venv
with pip, its dependencies from PyPI through pip's cache (goal: at most 30 s). How long
an install from ``dist/`` takes to roll out is printed by ``tests/test_release.py``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
import venv
from pathlib import Path
from types import ModuleType

from tests.bench import Result, progress

REPO = Path(__file__).resolve().parents[2]
RELEASE = REPO / "hack" / "release"
VERSION = "0.0.1"


def _ocindex() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rukpak_release_ocindex", RELEASE / "ocindex.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _release(dist: Path, arches: str) -> float:
    started = time.monotonic()
    done = subprocess.run(
        ["bash", str(RELEASE / "release.sh"), VERSION],
        env={**os.environ, "ARCHES": arches, "DIST": str(dist), "PYTHON": sys.executable},
        capture_output=True, text=True, timeout=3600, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"release.sh failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return time.monotonic() - started


def run(workdir: Path) -> list[Result]:
    arches = os.environ.get("ARCHES", "amd64 arm64")
    progress(f"release: first run ({arches}), filling cold caches")
    first = _release(workdir / "dist-1", arches)
    progress(f"release: first run took {first:.0f}s; the warm run")
    warm = _release(workdir / "dist", arches)
    results = [
        Result(f"make release ({arches}), first run here", first, "s", note="info: may be cold"),
        Result(f"make release ({arches}), warm cache", warm, "s", target=300),
    ]
    ocindex = _ocindex()
    with ocindex.opened(workdir / "dist" / f"rukpak-python-{VERSION}.oci.tar") as layout:
        summary = ocindex.check(layout)
    for arch, size in sorted(summary["sizes"].items()):
        results.append(Result(f"image linux/{arch}, compressed", size / 1e6, "MB", target=121))
    progress("release: pip install of the wheel into a new venv")
    started = time.monotonic()
    venv.create(workdir / "venv", with_pip=True)
    wheel = workdir / "dist" / f"rukpak_python-{VERSION}-py3-none-any.whl"
    subprocess.run(
        [str(workdir / "venv" / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
         str(wheel)],
        check=True, timeout=600,
    )  # fmt: skip
    subprocess.run([str(workdir / "venv" / "bin" / "rukpak"), "--help"], check=True,
                   capture_output=True)  # fmt: skip
    took = time.monotonic() - started
    results.append(Result("new venv + pip install of the CLI wheel", took, "s", target=30))
    return results
