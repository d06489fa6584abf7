"""Optional manifests: objects a bundle may ship for APIs the cluster might not serve.

Between loading (``formats``) and applying: an object annotated
``core.rukpak.io/optional: "true"`` whose apiVersion and kind the API server
does not serve (a ServiceMonitor without Prometheus) is set aside instead of
failing the install. ``split`` does that choice as pure logic over a
``served(api_version, kind)`` question the caller answers from discovery; an
API that a CRD in the same bundle provides counts as served, since CRDs are
applied (and waited for) before everything else. ``summary`` is the text for
status and the event; ``awaited`` is what a caller watches (CRDs of those
groups and kinds) to apply the skipped objects once the API appears.

Objects without the annotation are never skipped: an unserved API stays the
error it is today. The annotation accepts exactly ``"true"`` or ``"false"``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from provisioner.engine.bundle.manifest import Manifest
from provisioner.engine.errors import BundleInvalid
from provisioner.engine.objects import Obj, split_api_version

ANNOTATION = "core.rukpak.io/optional"

Served = Callable[[str, str], bool]
"""``served(api_version, kind)``: does the API server serve this kind at this version?"""


@dataclass(frozen=True)
class Skipped:
    manifest: Manifest

    @property
    def api(self) -> tuple[str, str, str]:
        """(group, version, kind) the object waits for."""
        group, version = split_api_version(self.manifest.obj["apiVersion"])
        return group, version, self.manifest.obj["kind"]

    def __str__(self) -> str:
        return f"{self.manifest.ref} ({self.manifest.obj['apiVersion']} is not served)"


def is_optional(manifest: Manifest) -> bool:
    """Whether the object carries ``core.rukpak.io/optional: "true"``."""
    annotations = manifest.obj.get("metadata", {}).get("annotations") or {}
    value = annotations.get(ANNOTATION)
    if value is None or value == "false":
        return False
    if value == "true":
        return True
    raise BundleInvalid(
        f"{manifest.source}: annotation {ANNOTATION} of {manifest.ref} is {value!r}; "
        'write "true" or "false" (quoted: YAML reads a bare true as a boolean)'
    )


def bundle_apis(manifests: Iterable[Manifest]) -> set[tuple[str, str, str]]:
    """(group, version, kind) served by the bundle's own CRDs once applied."""
    out: set[tuple[str, str, str]] = set()
    for m in manifests:
        obj = m.obj
        if obj.get("kind") != "CustomResourceDefinition":
            continue
        if split_api_version(str(obj.get("apiVersion")))[0] != "apiextensions.k8s.io":
            continue
        spec: Obj = obj.get("spec") or {}
        group = spec.get("group")
        kind = (spec.get("names") or {}).get("kind")
        if not isinstance(group, str) or not isinstance(kind, str):
            continue
        for version in spec.get("versions") or []:
            if isinstance(version, dict) and version.get("served") is not False:
                out.add((group, str(version.get("name")), kind))
    return out


def split(manifests: Iterable[Manifest], served: Served) -> tuple[list[Manifest], list[Skipped]]:
    """The manifests to apply, in their order, and the optional ones set aside.

    ``served`` is asked only about optional objects, once per apiVersion and kind.
    """
    items = list(manifests)
    provided = bundle_apis(items)
    answers: dict[tuple[str, str], bool] = {}
    kept: list[Manifest] = []
    skipped: list[Skipped] = []
    for m in items:
        if not is_optional(m):
            kept.append(m)
            continue
        api_version, kind = m.obj["apiVersion"], m.obj["kind"]
        group, version = split_api_version(api_version)
        key = (api_version, kind)
        if key not in answers:
            answers[key] = (group, version, kind) in provided or served(api_version, kind)
        if answers[key]:
            kept.append(m)
        else:
            skipped.append(Skipped(m))
    return kept, skipped


def summary(skipped: list[Skipped]) -> str:
    """One line for status and the event; empty when nothing was skipped."""
    if not skipped:
        return ""
    listed = "; ".join(str(s) for s in skipped)
    return (
        f"skipped {len(skipped)} optional object(s) whose API the cluster does not serve: "
        f"{listed}; they are created when the API appears"
    )


def awaited(skipped: list[Skipped]) -> set[tuple[str, str, str]]:
    """(group, version, kind) whose CRDs, once established, should trigger a new apply."""
    return {s.api for s in skipped}
