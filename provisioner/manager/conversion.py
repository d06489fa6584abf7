"""BundleDeployment conversion between ``core.rukpak.io/v1alpha1`` and ``v1alpha2``, pure.

Sits under ``webhook`` (the CRD's conversion webhook, served by the manager) and the
controller (which reads the storage version, v1alpha2, and plans an object in the
version it was created in). Lossless both ways:

- a v1alpha1 object (``spec.template`` generates Bundles) read as v1alpha2 gets
  ``spec.source`` from its template, keeps the rest of the template (its metadata, the
  Bundles' class) in the annotation ``V1ALPHA1_ANNOTATION``, and an ``installNamespace``
  (required in v1alpha2) defaulted to the manager's, remembered there as defaulted; back
  in v1alpha1 it is exactly what it was;
- a v1alpha2 object read as v1alpha1 gets a template built from its ``source`` (the
  first of ``sources``), and its v1alpha2-only fields (``V1ALPHA2_ONLY``: ``format``,
  ``sources``, ``requireImmutableRefs``, ``pollInterval``, ``preflight``,
  ``watchNamespaces``, ``ignore`` and the lifecycle fields of ``revisions`` and ``dependencies``) in
  the annotation ``V1ALPHA2_ANNOTATION``; back in v1alpha2 it is exactly what it was.

The annotation that is present says in which version an object was created (``origin``):
one created as v1alpha1 keeps its generated Bundles, one created as v1alpha2 has none.
Fields both versions have (``provisionerClassName``, ``installNamespace``, ``config``,
``paused``, ``serviceAccountName``, ``deletionPolicy``) and the whole status (both schemas
hold the union of the fields) are copied as they are.
"""

from __future__ import annotations

import copy
import json
from typing import Literal

from provisioner.engine.objects import Obj, json_annotation

GROUP = "core.rukpak.io"
V1ALPHA1 = f"{GROUP}/v1alpha1"
V1ALPHA2 = f"{GROUP}/v1alpha2"
V1ALPHA1_ANNOTATION = "core.rukpak.io/v1alpha1-template"
"""On a v1alpha2 view of an object created as v1alpha1: the rest of its template."""
V1ALPHA2_ANNOTATION = "core.rukpak.io/v1alpha2-spec"
"""On a v1alpha1 view of an object created as v1alpha2: its v1alpha2-only fields."""
V1ALPHA2_ONLY = (
    "format",
    "sources",
    "requireImmutableRefs",
    "pollInterval",
    "preflight",
    "watchNamespaces",
    "revisionHistoryLimit",
    "progressDeadlineSeconds",
    "rollbackOnFailure",
    "dependsOn",
    "healthChecks",
    "upgradePolicy",
    "ignore",
)
COMMON = (
    "provisionerClassName",
    "installNamespace",
    "config",
    "paused",
    "serviceAccountName",
    "deletionPolicy",
)
FORMAT_CLASSES = {
    "plain": "core-rukpak-io-plain",
    "registry-v1": "core-rukpak-io-registry",
    "helm": "core-rukpak-io-helm",
}
"""``spec.format`` and the provisioner class that handles it (the class wins when both are
given; the CRD refuses the two when they disagree)."""
DEFAULT_INSTALL_NAMESPACE = "default"

Origin = Literal["v1alpha1", "v1alpha2"]


class ConversionError(ValueError):
    """An object that cannot be converted (not a BundleDeployment, an unknown version)."""


def _annotation(bd: Obj, key: str) -> Obj | None:
    doc = json_annotation(bd, key)
    return doc if isinstance(doc, dict) else None


def _set_annotation(bd: Obj, key: str, value: Obj | None) -> None:
    meta = bd.setdefault("metadata", {})
    annotations = dict(meta.get("annotations") or {})
    if value is None:
        annotations.pop(key, None)
    else:
        annotations[key] = json.dumps(value, sort_keys=True, separators=(",", ":"))
    if annotations:
        meta["annotations"] = annotations
    else:
        meta.pop("annotations", None)


def origin(bd: Obj) -> Origin:
    """The version ``bd`` (in either version) was created in."""
    version = bd.get("apiVersion")
    if version == V1ALPHA2:
        return "v1alpha1" if _annotation(bd, V1ALPHA1_ANNOTATION) is not None else "v1alpha2"
    return "v1alpha2" if _annotation(bd, V1ALPHA2_ANNOTATION) is not None else "v1alpha1"


def class_of(spec: Obj) -> str:
    """The provisioner class a v1alpha2 spec names, directly or through ``format``."""
    named = spec.get("provisionerClassName")
    if isinstance(named, str) and named:
        return named
    return FORMAT_CLASSES.get(str(spec.get("format") or ""), "")


def to_v1alpha2(bd: Obj, *, default_namespace: str = DEFAULT_INSTALL_NAMESPACE) -> Obj:
    """``bd`` (either version) as v1alpha2."""
    if bd.get("apiVersion") == V1ALPHA2:
        return copy.deepcopy(bd)
    out, spec = _start(bd, source=V1ALPHA1, target=V1ALPHA2)
    spec_in: Obj = bd.get("spec") or {}
    template: Obj = spec_in.get("template") or {}
    template_spec: Obj = template.get("spec") or {}
    only = _annotation(bd, V1ALPHA2_ANNOTATION)
    if only is not None:  # created as v1alpha2: restore what v1alpha1 cannot hold
        _set_annotation(out, V1ALPHA2_ANNOTATION, None)
        restored = {k: copy.deepcopy(v) for k, v in only.items() if k in V1ALPHA2_ONLY}
        if not only.get("classNamed", True):
            spec.pop("provisionerClassName", None)
        if "sources" not in restored and "source" in template_spec:
            spec["source"] = copy.deepcopy(template_spec["source"])
        spec.update(restored)
    else:  # created as v1alpha1: keep the rest of the template aside
        rest: Obj = {}
        if template.get("metadata"):
            rest["metadata"] = copy.deepcopy(template["metadata"])
        if "provisionerClassName" in template_spec:
            rest["provisionerClassName"] = template_spec["provisionerClassName"]
        extra = {
            k: v for k, v in template_spec.items() if k not in ("source", "provisionerClassName")
        }
        if extra:
            rest["spec"] = copy.deepcopy(extra)
        if "source" in template_spec:
            spec["source"] = copy.deepcopy(template_spec["source"])
        if not spec.get("installNamespace"):
            spec["installNamespace"] = default_namespace
            rest["defaultedInstallNamespace"] = default_namespace
        _set_annotation(out, V1ALPHA1_ANNOTATION, rest)
    out["spec"] = spec
    return out


def to_v1alpha1(bd: Obj) -> Obj:
    """``bd`` (either version) as v1alpha1."""
    if bd.get("apiVersion") == V1ALPHA1:
        return copy.deepcopy(bd)
    out, spec = _start(bd, source=V1ALPHA2, target=V1ALPHA1)
    spec_in: Obj = bd.get("spec") or {}
    source = spec_in.get("source")
    if source is None:
        first = next(iter(spec_in.get("sources") or []), None)
        if isinstance(first, dict):
            source = {k: v for k, v in first.items() if k != "destination"}
    rest = _annotation(bd, V1ALPHA1_ANNOTATION)
    if rest is not None:  # created as v1alpha1: its template again
        _set_annotation(out, V1ALPHA1_ANNOTATION, None)
        template: Obj = {}
        if rest.get("metadata"):
            template["metadata"] = copy.deepcopy(rest["metadata"])
        template_spec: Obj = copy.deepcopy(rest.get("spec") or {})
        if "provisionerClassName" in rest:
            template_spec["provisionerClassName"] = rest["provisionerClassName"]
        if source is not None:
            template_spec["source"] = copy.deepcopy(source)
        template["spec"] = template_spec
        defaulted = rest.get("defaultedInstallNamespace")
        if defaulted is not None and spec.get("installNamespace") == defaulted:
            spec.pop("installNamespace")
    else:  # created as v1alpha2: a template that says the same, the rest aside
        klass = class_of(spec_in)
        only: Obj = {k: copy.deepcopy(spec_in[k]) for k in V1ALPHA2_ONLY if k in spec_in}
        if not spec_in.get("provisionerClassName"):
            only["classNamed"] = False
            if klass:
                spec["provisionerClassName"] = klass
        template_spec = {"provisionerClassName": klass}
        if source is not None:
            template_spec["source"] = copy.deepcopy(source)
        template = {"spec": template_spec}
        _set_annotation(out, V1ALPHA2_ANNOTATION, only)
    spec["template"] = template
    out["spec"] = spec
    return out


def convert(bd: Obj, version: str, *, default_namespace: str = DEFAULT_INSTALL_NAMESPACE) -> Obj:
    """``bd`` as ``version`` (``core.rukpak.io/v1alpha1`` or ``/v1alpha2``)."""
    if version == V1ALPHA1:
        return to_v1alpha1(bd)  # (v1alpha1 requires nothing a v1alpha2 object lacks)
    if version == V1ALPHA2:
        return to_v1alpha2(bd, default_namespace=default_namespace)
    raise ConversionError(
        f"cannot convert to {version!r}: this webhook serves {V1ALPHA1} and {V1ALPHA2}"
    )


def _start(bd: Obj, *, source: str, target: str) -> tuple[Obj, Obj]:
    """A copy of ``bd`` (a BundleDeployment in ``source``) as ``target``, its spec yet to
    convert; and a new spec holding the fields both versions have (``COMMON``)."""
    _check(bd, source)
    out = copy.deepcopy(bd)
    out["apiVersion"] = target
    spec_in: Obj = bd.get("spec") or {}
    return out, {k: copy.deepcopy(spec_in[k]) for k in COMMON if k in spec_in}


def _check(bd: Obj, version: str) -> None:
    if bd.get("kind") != "BundleDeployment":
        raise ConversionError(f"cannot convert a {bd.get('kind')!r}: only BundleDeployments")
    if bd.get("apiVersion") != version:
        raise ConversionError(
            f"cannot convert from {bd.get('apiVersion')!r}: this webhook serves {V1ALPHA1} and "
            f"{V1ALPHA2}"
        )


def review(body: Obj, *, default_namespace: str = DEFAULT_INSTALL_NAMESPACE) -> Obj:
    """The ``apiextensions.k8s.io/v1`` ConversionReview response to a request."""
    request: Obj = body.get("request") or {}
    uid = str(request.get("uid") or "")
    desired = str(request.get("desiredAPIVersion") or "")
    response: Obj = {"uid": uid}
    try:
        objects = request.get("objects")
        if not isinstance(objects, list):
            raise ConversionError("request.objects must be a list of objects")
        converted = []
        for obj in objects:
            if not isinstance(obj, dict):
                raise ConversionError("every object to convert must be an object")
            converted.append(convert(obj, desired, default_namespace=default_namespace))
        response["convertedObjects"] = converted
        response["result"] = {"status": "Success"}
    except ConversionError as err:
        response["result"] = {"status": "Failure", "message": str(err)}
    return {
        "apiVersion": str(body.get("apiVersion") or "apiextensions.k8s.io/v1"),
        "kind": "ConversionReview",
        "response": response,
    }
