"""CRD upgrade safety: the preflight run before a bundle replaces an existing CRD.

Sits between ordering and apply. For each CRD in the bundle that already
exists on the cluster, ``check`` compares the live CRD, the new one and the
existing custom resources (read by the caller through the adapter) and returns
reasons to refuse, each naming the CRD, the version and the field:

- a version listed in the live CRD's ``status.storedVersions`` is removed
  (objects stored at that version could no longer be read; upstream's words);
- a stored version would stop being served (clients reading it break, and the
  data cannot be migrated through the API any more);
- the scope changes (Namespaced <-> Cluster);
- an existing custom resource fails the new version's ``openAPIV3Schema``, or
  holds a field the new schema would prune (upstream's crdvalidator words: ``existing
  custom object NS/NAME failed validation for new schema version V: FIELD ERRORS``, with
  up to ``MAX_REASONS_PER_VERSION`` objects named where upstream names the first).

A CRD carrying ``core.rukpak.io/crd-upgrade-safety: disabled`` skips all checks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from provisioner.engine.bundle import words
from provisioner.engine.kube import schema
from provisioner.engine.objects import Obj, meta_of

OPT_OUT_ANNOTATION = "core.rukpak.io/crd-upgrade-safety"
OPT_OUT_VALUE = "disabled"
MAX_REASONS_PER_VERSION = 10


def opted_out(crd: Obj) -> bool:
    annotations = meta_of(crd).get("annotations") or {}
    return annotations.get(OPT_OUT_ANNOTATION) == OPT_OUT_VALUE


def _versions(crd: Obj) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in (crd.get("spec") or {}).get("versions") or [] if "name" in v}


def read_plan(live: Obj, new: Obj) -> dict[str, str]:
    """For each new version with a schema: the live version to list existing resources at.

    A version the live CRD serves is read as itself. A version it does not serve yet
    is read at a served live version when conversion is ``None`` (content is the same
    then, only apiVersion differs); with webhook conversion it cannot be checked here.
    """
    live_versions = _versions(live)
    served = [n for n, v in live_versions.items() if v.get("served")]
    storage = next((n for n, v in live_versions.items() if v.get("storage")), None)
    fallback = storage if storage in served else (served[0] if served else None)
    strategy = ((live.get("spec") or {}).get("conversion") or {}).get("strategy", "None")
    plan: dict[str, str] = {}
    for name, version in _versions(new).items():
        if not (version.get("schema") or {}).get("openAPIV3Schema"):
            continue
        if name in served:
            plan[name] = name
        elif strategy == "None" and fallback is not None:
            plan[name] = fallback
    return plan


def check(live: Obj, new: Obj, existing: Mapping[str, Sequence[Obj]]) -> list[str]:
    """Reasons the upgrade from ``live`` to ``new`` is unsafe, each naming the CRD (the
    apply-time preflight lists them); empty when it is safe. See ``findings``."""
    name = meta_of(new).get("name", "?")
    return [f"CRD {name}: {finding}" for finding in findings(live, new, existing)]


def findings(live: Obj, new: Obj, existing: Mapping[str, Sequence[Obj]]) -> list[str]:
    """What makes the upgrade from ``live`` to ``new`` unsafe, in upstream's crdvalidator
    words where it has them (``words.stored_versions_removed``, ``words.existing_invalid``);
    empty when it is safe or ``new`` opts out.

    ``existing`` maps a version of ``new`` to the custom resources read for it
    (see ``read_plan``).
    """
    if opted_out(new):
        return []
    reasons: list[str] = []
    stored = list((live.get("status") or {}).get("storedVersions") or [])
    new_versions = _versions(new)
    removed = [version for version in stored if version not in new_versions]
    if removed:
        reasons.append(words.stored_versions_removed(removed))
    for version in stored:
        if version in removed:
            continue
        if not new_versions[version].get("served", False) and version != _storage(new):
            reasons.append(f"version {version} is stored but would no longer be served")
    live_scope = (live.get("spec") or {}).get("scope")
    new_scope = (new.get("spec") or {}).get("scope")
    if live_scope and new_scope and live_scope != new_scope:
        reasons.append(f"scope changes from {live_scope} to {new_scope}")
    for version, objs in sorted(existing.items()):
        spec = (new_versions.get(version) or {}).get("schema") or {}
        open_api = spec.get("openAPIV3Schema")
        if not open_api:
            continue
        found = 0
        for obj in objs:
            meta = obj.get("metadata") or {}
            violations = schema.validate(obj, open_api, root=True)
            if not violations:
                continue
            found += 1
            if found <= MAX_REASONS_PER_VERSION:
                reasons.append(
                    words.existing_invalid(
                        str(meta.get("namespace") or ""),
                        str(meta.get("name") or "?"),
                        version,
                        [field_error(v) for v in violations],
                    )
                )
        if found > MAX_REASONS_PER_VERSION:
            reasons.append(
                f"version {version}: {found - MAX_REASONS_PER_VERSION} more existing custom"
                " objects fail the new schema"
            )
    return reasons


def field_error(violation: schema.Violation) -> str:
    """One violation as the API machinery's field errors read (``spec.colour: Required
    value``); the detail of other kinds of violation is ours."""
    path = violation.path.lstrip(".") or "<root>"
    if violation.message == "is required":
        return f"{path}: Required value"
    return f"{path}: {violation.message}"


def _storage(crd: Obj) -> str | None:
    return next((n for n, v in _versions(crd).items() if v.get("storage")), None)


def new_kind(crd: Obj) -> str:
    return str(((crd.get("spec") or {}).get("names") or {}).get("kind", "resource"))
