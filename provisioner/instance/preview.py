"""``rukpak-provisioner instance --preview``: what a paused BundleDeployment would do.

Sits beside ``process`` (the install) in the instance pod: the same mounted bundle is
loaded and prepared as an install would (``engine.preflight``: namespaces filled in,
unknown kinds refused), nothing is applied. ``engine.preview`` summarises the objects,
their RBAC and CRDs; the installed side for the diff comes from the deployment's
inventory (RBAC objects and CRDs read live, the rest by reference). The full text and
the diff go to the ConfigMap ``rukpak-preview-<bd>`` in the system namespace (``rukpak
preview`` prints them); the bounded summary goes to the termination message, which the
manager copies into ``status.preview``.
"""

from __future__ import annotations

import json
import logging

from provisioner.engine.apply import apply, inventory, preflight
from provisioner.engine.bundle import formats
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef
from provisioner.engine.preview import preview

log = logging.getLogger("rukpak.instance")

_BODIES = frozenset(
    {
        (preview.RBAC_GROUP, "ClusterRole"),
        (preview.RBAC_GROUP, "Role"),
        (preview.RBAC_GROUP, "ClusterRoleBinding"),
        (preview.RBAC_GROUP, "RoleBinding"),
        (preview.CRD_GROUP, "CustomResourceDefinition"),
    }
)
"""Installed kinds read whole for the diff (their rules, subjects and names matter)."""


def installed(kube: Kube, name: str, *, system_namespace: str) -> list[Obj]:
    """What deployment ``name`` has installed, as far as a preview compares it."""
    ref = ObjectRef("", "v1", "ConfigMap", system_namespace, inventory.configmap_name(name))
    cm = kube.get(ref)
    if cm is None:
        return []
    out: list[Obj] = []
    for obj_ref in sorted(inventory.from_configmap(cm).refs):
        if (obj_ref.group, obj_ref.kind) in _BODIES:
            live = kube.get(obj_ref)
            if live is not None:
                out.append(live)
            continue
        meta: Obj = {"name": obj_ref.name}
        if obj_ref.namespace:
            meta["namespace"] = obj_ref.namespace
        out.append({"apiVersion": obj_ref.api_version, "kind": obj_ref.kind, "metadata": meta})
    return out


def _clip(text: str) -> str:
    raw = text.encode()
    if len(raw) <= preview.TEXT_LIMIT:
        return text
    return raw[: preview.TEXT_LIMIT].decode(errors="ignore") + "\n... (cut)\n"


def run(kube: Kube, bundle: formats.Bundle, options: apply.Options, *, revision: str) -> str:
    """Preview ``bundle`` as installing it with ``options`` would go: write the ConfigMap,
    return the summary (JSON, within ``preview.STATUS_LIMIT`` bytes)."""
    name, system_namespace = options.name, options.system_namespace
    prepared = [
        m.obj for m in preflight.prepare(kube, bundle, name=name, namespace=options.namespace)
    ]
    new = preview.preview(prepared)
    before = preview.preview(installed(kube, name, system_namespace=system_namespace))
    changes = preview.diff(new, before)
    added = preview.added_rules(new, before)  # what upgradePolicy: ApproveEscalations stops on
    new_rules = [preview.cut(r) for r in added[: preview.NEW_RULES_LIMIT]]
    if len(added) > preview.NEW_RULES_LIMIT:
        new_rules.append(f"... and {len(added) - preview.NEW_RULES_LIMIT} more")
    room = preview.STATUS_LIMIT - 200 - len(json.dumps(new_rules))
    summary = preview.summary(new, limit=room)
    summary["revision"] = revision
    summary["changes"] = sum(1 for line in changes.splitlines() if line[:2] in ("+ ", "- "))
    summary["newRules"] = new_rules
    body: Obj = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": preview.configmap_name(name),
            "namespace": system_namespace,
            "labels": {
                "app.kubernetes.io/part-of": "rukpak",
                "app.kubernetes.io/managed-by": "rukpak-instance",
                preview.PREVIEW_LABEL: name,
            },
        },
        "data": {
            preview.SUMMARY_KEY: json.dumps(summary, sort_keys=True),
            preview.RENDER_KEY: _clip(preview.render(new)),
            preview.DIFF_KEY: _clip(changes),
            preview.REVISION_KEY: revision,
        },
    }
    kube.apply(body, manager="rukpak-preview")
    log.info(
        "msg='preview written' deployment=%s objects=%d escalations=%d changes=%d",
        name,
        len(new.objects),
        len(new.escalations),
        summary["changes"],
    )
    return json.dumps(summary, sort_keys=True, separators=(",", ":"))
