"""``rukpak-provisioner unpack``: the check of a v1alpha1 Bundle's content.

Sits in the instance package beside the instance process, at the far end of the Bundle
controller (``manager.bundleplan``); the standing provisioner runs :func:`validate`
in-process over the content the node store serves it (``standing.worker``), and the
result goes back the same way. Without it, the unpack pod
mounts the Bundle's pinned content read-only at ``/bundle`` (an image, git commit or
http tarball through the CSI driver, or a projected volume of ConfigMaps; see
``sources.volume``) and runs this command, which validates the content with the format loader
(``provisioner.engine.bundle.formats``) and reports the outcome as one JSON document
in the container's termination message (``/dev/termination-log``), which the
manager reads from the pod's status. No content ever leaves the node: only
the object count and kinds, or the error.

The error is the loader's message: upstream's words where upstream has them (a
missing ``manifests`` directory, a subdirectory in it, zero objects, a file that is
not an object, a registry+v1 conversion), then the file and document
(``provisioner.engine.bundle.words``).

Exit status: 0 when the bundle is valid, 1 when it is not (the pod then ends
``Failed``), 2 on a usage error. The result format (``Result.to_json``)::

    {"objects": 3, "kinds": {"ConfigMap": 2, "Namespace": 1}}
    {"error": "get objects from bundle manifests: readdir manifests: file does not exist"}
"""

from __future__ import annotations

import argparse
import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioner.engine.bundle import formats
from provisioner.engine.errors import BundleInvalid
from provisioner.runtime import flags, termination
from rukpak.common import command

log = logging.getLogger("rukpak.unpack")

EXIT_OK = 0
EXIT_INVALID = 1
MESSAGE_LIMIT = 3800
"""Kubernetes keeps 4096 bytes of a termination message (``termination.MESSAGE_LIMIT``);
leave room for the JSON around it."""


@dataclass(frozen=True)
class Result:
    """What the unpack pod reports: the kinds it found, or the error."""

    kinds: dict[str, int] = field(default_factory=dict)
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def objects(self) -> int:
        return sum(self.kinds.values())

    def to_json(self) -> str:
        if self.error:
            return json.dumps({"error": self.error[:MESSAGE_LIMIT]})
        return json.dumps({"objects": self.objects, "kinds": dict(sorted(self.kinds.items()))})

    @classmethod
    def from_json(cls, text: str) -> Result | None:
        """The result in a termination message; None when it holds no result of ours."""
        try:
            doc: Any = json.loads(text)
        except ValueError:
            return None
        if not isinstance(doc, dict):
            return None
        if isinstance(doc.get("error"), str):
            return cls(error=doc["error"])
        kinds = doc.get("kinds")
        if isinstance(kinds, dict) and all(isinstance(v, int) for v in kinds.values()):
            return cls(kinds={str(k): int(v) for k, v in kinds.items()})
        return None

    def summary(self) -> str:
        """``3 objects (ConfigMap 2, Namespace 1)``."""
        parts = ", ".join(f"{kind} {n}" for kind, n in sorted(self.kinds.items()))
        noun = "object" if self.objects == 1 else "objects"
        return f"{self.objects} {noun} ({parts})"


def validate(root: Path, *, format: str = formats.DEFAULT_FORMAT) -> Result:
    """Validate the bundle at ``root``; never raises for a bad bundle. The error is the
    loader's, in upstream's words (``words``), as the instance run of a v1alpha2
    BundleDeployment reports it too."""
    try:
        bundle = formats.load(root, format=format)
    except BundleInvalid as err:
        return Result(error=err.message)
    except OSError as err:
        return Result(error=f"cannot read the bundle at {root}: {err}")
    return Result(kinds=dict(Counter(str(m.obj.get("kind")) for m in bundle.manifests)))


# -- the command line -------------------------------------------------------------------


def register(subparsers: Any) -> None:
    p = command.add(subparsers, "unpack", run_unpack)
    flags.add_bundle_dir(p)
    flags.add_format(p)
    termination.add_flag(p, what="the JSON result")


def run_unpack(args: argparse.Namespace) -> int:
    """validate a mounted bundle and report it in the termination message

    Validate the bundle at --bundle-dir with the format loader and write the result (object
    count and kinds, or the error) as JSON to the termination log.

    exit status: 0 valid; 1 invalid; 2 usage error
    """
    result = validate(args.bundle_dir, format=args.format)
    text = result.to_json()
    print(text, flush=True)
    termination.write(termination.where(args.termination_log), text)
    if result.ok:
        log.info("msg='bundle valid' %s", result.summary())
        return EXIT_OK
    log.error("msg='bundle invalid' error=%r", result.error)
    return EXIT_INVALID
