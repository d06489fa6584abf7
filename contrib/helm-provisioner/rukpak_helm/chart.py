"""Charts: find the chart in a Bundle's files, read the values, render with ``helm template``.

Where it sits: between the content store (``content``: a Bundle's files on local disk)
and the apply engine. ``find_chart`` locates the chart as upstream's ``helm+v3``
format allows (``Chart.yaml`` at the bundle root, or in the one directory under it;
also one ``.tgz`` chart archive); ``check`` loads it with ``helm show chart``
(helm's own loader and validation); ``values_of`` reads ``spec.config.values``, a
YAML string as upstream; ``render`` runs ``helm template`` and turns its output into
``api.Manifest`` objects, each remembering the template it came from
(``# Source: chart/templates/x.yaml``), so an apply error names that template.

The only module that runs the ``helm`` binary. It never talks to the cluster:
``helm template`` renders offline (no hooks: ``--no-hooks``; CRDs of ``crds/`` are
included).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from provisioner import api

HELM_TIMEOUT = 120.0
"""Seconds a ``helm`` command may take before the render counts as failed."""
SOURCE_PREFIX = "# Source: "


class ChartError(Exception):
    """A chart or its values cannot be used; ``str()`` says what and what to do."""


@dataclass(frozen=True)
class Rendered:
    bundle: api.Bundle
    """What to install: the rendered objects, format ``helm+v3``."""
    templates: int
    """How many templates produced objects."""


FORMAT = "helm+v3"


def find_chart(root: Path) -> Path:
    """The chart in a bundle's files: ``root`` itself (``Chart.yaml`` there), its one
    subdirectory holding a ``Chart.yaml``, or its one ``*.tgz`` archive."""
    if (root / "Chart.yaml").is_file():
        return root
    entries = [p for p in sorted(root.iterdir()) if not p.name.startswith(".")]
    dirs = [
        p for p in entries if p.is_dir() and not p.is_symlink() and (p / "Chart.yaml").is_file()
    ]
    archives = [p for p in entries if p.is_file() and p.name.endswith(".tgz")]
    if len(dirs) + len(archives) == 1:
        return (dirs or archives)[0]
    found = ", ".join(p.name for p in entries) or "nothing"
    if len(dirs) + len(archives) > 1:
        raise ChartError(
            f"the bundle holds several charts ({', '.join(p.name for p in dirs + archives)}); "
            "a helm bundle holds one chart"
        )
    raise ChartError(
        "no helm chart in the bundle: expected Chart.yaml at its root or in one directory "
        f"under it, or one .tgz chart archive (found: {found})"
    )


def values_of(bd: api.Obj) -> dict[str, Any]:
    """The values in the BundleDeployment's ``spec.config.values`` (a YAML string, as
    upstream's helm provisioner reads it); {} when there is none."""
    config = (bd.get("spec") or {}).get("config") or {}
    if not isinstance(config, dict):
        raise ChartError("spec.config must be an object with a `values` string")
    text = config.get("values")
    if text is None or text == "":
        return {}
    if not isinstance(text, str):
        raise ChartError(
            "spec.config.values must be a string holding YAML (write `values: |` and the "
            "values indented below it)"
        )
    try:
        values = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ChartError(f"spec.config.values is not valid YAML: {err}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ChartError(
            f"spec.config.values must hold a YAML map of values, not a {type(values).__name__}"
        )
    return values


def _run(helm: Path, args: list[str], *, workdir: Path) -> str:
    """``helm ARGS`` with its config, cache and data dirs in ``workdir`` (the root file
    system may be read-only); stdout, or ChartError with helm's message."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(workdir),
        "HELM_CACHE_HOME": str(workdir / "cache"),
        "HELM_CONFIG_HOME": str(workdir / "config"),
        "HELM_DATA_HOME": str(workdir / "data"),
    }
    try:
        done = subprocess.run(
            [str(helm), *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=workdir,
            timeout=HELM_TIMEOUT,
            check=False,
        )
    except FileNotFoundError:
        raise ChartError(f"no helm binary at {helm}; pass --helm PATH") from None
    except subprocess.TimeoutExpired:
        raise ChartError(f"helm {args[0]} took longer than {HELM_TIMEOUT:.0f}s") from None
    if done.returncode != 0:
        message = done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}"
        message = message.removeprefix("Error: ")
        raise ChartError(f"helm {args[0]} failed: {message[-2000:]}")
    return done.stdout


def check(helm: Path, chart: Path) -> dict[str, Any]:
    """Load and validate the chart with helm's loader; its ``Chart.yaml`` as a dict."""
    with tempfile.TemporaryDirectory(prefix="rukpak-helm-") as tmp:
        out = _run(helm, ["show", "chart", str(chart)], workdir=Path(tmp))
    meta = yaml.safe_load(out)
    return meta if isinstance(meta, dict) else {}


def render(
    helm: Path, chart: Path, *, release: str, namespace: str, values: dict[str, Any]
) -> Rendered:
    """``helm template`` of ``chart`` as release ``release`` in ``namespace`` with
    ``values``; the objects it renders. ChartError for a render error, or output the
    engine cannot read (naming the template)."""
    with tempfile.TemporaryDirectory(prefix="rukpak-helm-") as tmp:
        work = Path(tmp)
        values_file = work / "values.yaml"
        values_file.write_text(yaml.safe_dump(values))
        out = _run(
            helm,
            [
                "template", release, str(chart),
                "--namespace", namespace,
                "--values", str(values_file),
                "--include-crds",
                "--no-hooks",
            ],
            workdir=work,
        )  # fmt: skip
    return Rendered(*split(out))


def split(output: str) -> tuple[api.Bundle, int]:
    """``helm template`` output -> the bundle of its objects, each remembering the
    template it came from, and the number of templates with objects."""
    by_source: dict[str, list[str]] = {}
    current: list[str] = []
    source = "rendered.yaml"

    def flush() -> None:
        content = [x for x in current if x.strip() and not x.lstrip().startswith("#")]
        if content:
            by_source.setdefault(source, []).append("".join(current))

    for line in output.splitlines(keepends=True):
        if line.rstrip() == "---" or line.startswith("--- "):
            flush()
            current, source = [], "rendered.yaml"
        elif line.startswith(SOURCE_PREFIX) and not "".join(current).strip():
            source = line[len(SOURCE_PREFIX) :].strip()
            current.append(line)
        else:
            current.append(line)
    flush()
    manifests: list[api.Manifest] = []
    templates = 0
    for name, docs in by_source.items():
        try:
            found = api.parse_manifests(name, "---\n".join(docs))
        except api.BundleInvalid as err:
            raise ChartError(
                f"the chart rendered something that is not an object: {err.message}"
            ) from None
        manifests += found
        templates += bool(found)
    if not manifests:
        raise ChartError("the chart rendered no objects with these values")
    return api.Bundle(FORMAT, tuple(manifests)), templates
