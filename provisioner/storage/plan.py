"""Pure decisions of the provisioner role: which claims to provision, what to ask
CreateVolume, the PV to create, and what to do with a PV.

Where it sits: ``provisioner.storage.controller`` feeds it the cached claim,
StorageClass and PV (decoded JSON) and performs what it returns; nothing here
talks to the API or the CSI socket. The protocol facts are those of
kubernetes-csi external-provisioner and sig-storage-lib-external-provisioner:
the claim annotation the PV controller sets (``volume.kubernetes.io/
storage-provisioner``, or the beta one), PV name ``pvc-<claim uid>``,
StorageClass parameters under ``csi.storage.k8s.io/`` naming secrets (removed
from CreateVolume's parameters; any other key under that prefix is refused),
secret name templates (``${pvc.name}``, ``${pvc.namespace}``, ``${pv.name}``,
``${pvc.annotations['key']}``), the ``pv.kubernetes.io/provisioned-by``
annotation, the deletion-secret annotations, and the finalizer
``external-provisioner.volume.kubernetes.io/finalizer`` on PVs whose reclaim
policy is Delete.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from provisioner.engine.objects import Obj
from provisioner.storage import quantity
from rukpak.common import errors

ANN_STORAGE_PROVISIONER = "volume.kubernetes.io/storage-provisioner"
ANN_BETA_STORAGE_PROVISIONER = "volume.beta.kubernetes.io/storage-provisioner"
ANN_SELECTED_NODE = "volume.kubernetes.io/selected-node"
ANN_PROVISIONED_BY = "pv.kubernetes.io/provisioned-by"
ANN_MIGRATED_TO = "pv.kubernetes.io/migrated-to"
ANN_DELETION_SECRET_NAME = "volume.kubernetes.io/provisioner-deletion-secret-name"
ANN_DELETION_SECRET_NAMESPACE = "volume.kubernetes.io/provisioner-deletion-secret-namespace"
FINALIZER = "external-provisioner.volume.kubernetes.io/finalizer"

PARAMETER_PREFIX = "csi.storage.k8s.io/"
FSTYPE_KEY = PARAMETER_PREFIX + "fstype"
# secret kind → (name key, namespace key, deprecated name key, deprecated namespace key)
SECRET_KINDS = {
    kind: (
        f"{PARAMETER_PREFIX}{key}-secret-name",
        f"{PARAMETER_PREFIX}{key}-secret-namespace",
        f"csi{kind}SecretName" if deprecated else "",
        f"csi{kind}SecretNamespace" if deprecated else "",
    )
    for kind, key, deprecated in (
        ("Provisioner", "provisioner", True),
        ("ControllerPublish", "controller-publish", True),
        ("NodeStage", "node-stage", True),
        ("NodePublish", "node-publish", True),
        ("ControllerExpand", "controller-expand", False),
        ("NodeExpand", "node-expand", False),
        ("ControllerModify", "controller-modify", False),
    )
}
SECRET_KINDS["Default"] = (
    f"{PARAMETER_PREFIX}secret-name",
    f"{PARAMETER_PREFIX}secret-namespace",
    "",
    "",
)
KNOWN_PREFIXED = frozenset({FSTYPE_KEY} | {k for keys in SECRET_KINDS.values() for k in keys[:2]})

# Kubernetes access mode → CSI access mode name (csi.v1 VolumeCapability.AccessMode.Mode).
ACCESS_MODES = {
    "ReadWriteOnce": "SINGLE_NODE_WRITER",
    "ReadOnlyMany": "MULTI_NODE_READER_ONLY",
    "ReadWriteMany": "MULTI_NODE_MULTI_WRITER",
    "ReadWriteOncePod": "SINGLE_NODE_SINGLE_WRITER",
}

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS1123_SUBDOMAIN = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
)
_TOKEN = re.compile(r"\$\{([^}]*)\}")


@dataclass(frozen=True)
class SecretRef:
    name: str
    namespace: str

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "namespace": self.namespace}


@dataclass(frozen=True)
class Capability:
    """One CSI volume capability: ``block`` or a mount with ``fs_type``; a CSI mode name."""

    mode: str
    block: bool = False
    fs_type: str = ""
    mount_flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class CreateRequest:
    """What CreateVolume is asked for one claim, and the PV fields that follow from it."""

    name: str
    parameters: dict[str, str]
    capabilities: tuple[Capability, ...]
    required_bytes: int
    fs_type: str = ""
    provisioner_secret: SecretRef | None = None
    node_publish_secret: SecretRef | None = None
    other_secrets: dict[str, SecretRef] = field(default_factory=dict)


@dataclass(frozen=True)
class CreatedVolume:
    """What CreateVolume answered: the volume the PV will name (``persistent_volume``)."""

    volume_id: str
    capacity_bytes: int
    volume_context: dict[str, str]


def meta(obj: Obj) -> Obj:
    return obj.get("metadata") or {}


def annotations_of(obj: Obj) -> dict[str, str]:
    return meta(obj).get("annotations") or {}


def claim_key(claim: Obj) -> str:
    return f"{meta(claim).get('namespace', '')}/{meta(claim).get('name', '')}"


def claim_class(claim: Obj) -> str:
    """The claim's StorageClass name: ``spec.storageClassName``, else the beta annotation."""
    name = (claim.get("spec") or {}).get("storageClassName")
    if name is None:
        name = annotations_of(claim).get("volume.beta.kubernetes.io/storage-class", "")
    return str(name or "")


def pv_name(claim: Obj) -> str:
    """``pvc-<claim uid>``: deterministic, so a retried provisioning cannot create two PVs."""
    return f"pvc-{meta(claim)['uid']}"


# --- claims ---------------------------------------------------------------------------


def should_provision(claim: Obj, storage_class: Obj | None, driver: str) -> bool:
    """Whether ``claim`` is ours to provision now (sig-storage-lib ``shouldProvision``).

    Unbound, annotated by the PV controller with our driver as its storage
    provisioner and, for a WaitForFirstConsumer class, with a selected node.
    ``storage_class`` None (not cached yet) counts as Immediate binding.
    """
    if (claim.get("spec") or {}).get("volumeName"):
        return False
    if meta(claim).get("deletionTimestamp"):
        return False
    anns = annotations_of(claim)
    provisioner = anns.get(ANN_STORAGE_PROVISIONER)
    if provisioner is None:
        provisioner = anns.get(ANN_BETA_STORAGE_PROVISIONER)
    if provisioner != driver:
        return False
    if storage_class is not None and storage_class.get("volumeBindingMode") == (
        "WaitForFirstConsumer"
    ):
        return bool(anns.get(ANN_SELECTED_NODE))
    return True


def create_request(claim: Obj, storage_class: Obj, driver: str) -> CreateRequest:
    """The CreateVolume request for ``claim`` (external-provisioner ``prepareProvision``).

    InvalidArgument, with a message for the claim's ProvisioningFailed event,
    when the claim or class asks for something this role cannot do.
    """
    if storage_class.get("provisioner") != driver:
        raise errors.FailedPrecondition(
            f"StorageClass {meta(storage_class).get('name')!r} names provisioner "
            f"{storage_class.get('provisioner')!r}, not {driver!r}"
        )
    spec = claim.get("spec") or {}
    if spec.get("selector") is not None:
        raise errors.InvalidArgument("claim Selector is not supported")
    if spec.get("dataSource") or spec.get("dataSourceRef"):
        raise errors.InvalidArgument(
            "claim dataSource is not supported: a bundle volume's content is the image named "
            "by its StorageClass; remove spec.dataSource"
        )
    params = {str(k): str(v) for k, v in (storage_class.get("parameters") or {}).items()}
    name = pv_name(claim)
    fs_type = _fs_type(params)
    block = spec.get("volumeMode") == "Block"
    modes = spec.get("accessModes") or []
    if not modes:
        raise errors.InvalidArgument("claim has no accessModes; use [ReadOnlyMany]")
    capabilities = []
    for mode in modes:
        csi_mode = ACCESS_MODES.get(str(mode))
        if csi_mode is None:
            raise errors.InvalidArgument(f"unknown access mode {mode!r} in the claim")
        mount_flags = tuple(str(o) for o in storage_class.get("mountOptions") or ())
        capabilities.append(
            Capability(csi_mode, block=block, fs_type="" if block else fs_type,
                       mount_flags=() if block else mount_flags)
        )  # fmt: skip
    requested = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "0")
    required = quantity.to_bytes(str(requested), what="the claim's requested storage")
    secrets = {
        kind: ref
        for kind in SECRET_KINDS
        if kind != "Default" and (ref := secret_reference(kind, params, name, claim)) is not None
    }
    return CreateRequest(
        name=name,
        parameters=_without_prefixed(params),
        capabilities=tuple(capabilities),
        required_bytes=required,
        fs_type=fs_type,
        provisioner_secret=secrets.pop("Provisioner", None),
        node_publish_secret=secrets.pop("NodePublish", None),
        other_secrets=secrets,
    )


def _fs_type(params: dict[str, str]) -> str:
    found = [v for k, v in params.items() if k.lower() == "fstype" or k == FSTYPE_KEY]
    if len(found) > 1:
        raise errors.InvalidArgument(
            f'fstype specified in parameters with both "fstype" and "{FSTYPE_KEY}" keys'
        )
    return found[0] if found else ""


def _without_prefixed(params: dict[str, str]) -> dict[str, str]:
    out = {}
    for key, value in params.items():
        if key.startswith(PARAMETER_PREFIX):
            if key not in KNOWN_PREFIXED:
                raise errors.InvalidArgument(
                    f'found unknown parameter key "{key}" with reserved namespace '
                    f"{PARAMETER_PREFIX}"
                )
            continue
        out[key] = value
    return out


def secret_reference(kind: str, params: dict[str, str], pv: str, claim: Obj) -> SecretRef | None:
    """The Secret a StorageClass names for ``kind`` (e.g. NodePublish), templates resolved;
    falls back to the class's default ``csi.storage.k8s.io/secret-name/-namespace``."""
    found = _secret_templates(kind, params)
    if found is None:
        found = _secret_templates("Default", params)
    if found is None:
        return None
    name_t, namespace_t = found
    namespace = _resolve(
        namespace_t, {"pv.name": pv, "pvc.namespace": str(meta(claim).get("namespace", ""))}
    )
    if not _DNS1123_LABEL.match(namespace) or len(namespace) > 63:
        raise errors.InvalidArgument(f"{namespace_t!r} is not a valid namespace name")
    tokens = {
        "pv.name": pv,
        "pvc.name": str(meta(claim).get("name", "")),
        "pvc.namespace": str(meta(claim).get("namespace", "")),
    }
    tokens.update({f"pvc.annotations['{k}']": v for k, v in annotations_of(claim).items()})
    name = _resolve(name_t, tokens)
    if not _DNS1123_SUBDOMAIN.match(name) or len(name) > 253:
        raise errors.InvalidArgument(f"{name_t!r} resolved to {name!r}: not a valid secret name")
    return SecretRef(name=name, namespace=namespace)


def _secret_templates(kind: str, params: dict[str, str]) -> tuple[str, str] | None:
    name_key, namespace_key, old_name_key, old_namespace_key = SECRET_KINDS[kind]
    names = [params[k] for k in (old_name_key, name_key) if k and k in params]
    namespaces = [params[k] for k in (old_namespace_key, namespace_key) if k and k in params]
    if len(names) > 1 or len(namespaces) > 1:
        raise errors.InvalidArgument(
            f'{kind} secrets specified in parameters with both "csi" and "{PARAMETER_PREFIX}" keys'
        )
    if len(names) != len(namespaces):
        raise errors.InvalidArgument(
            f"either name and namespace for {kind} secrets specified, Both must be specified"
        )
    if not names:
        return None
    if not names[0] or not namespaces[0]:
        raise errors.InvalidArgument(
            f"{kind} secrets specified in parameters but value of either namespace or name is empty"
        )
    return names[0], namespaces[0]


def _resolve(template: str, tokens: dict[str, str]) -> str:
    missing = [t for t in _TOKEN.findall(template) if t not in tokens]
    if missing:
        raise errors.InvalidArgument(
            f"error resolving value {template!r}: invalid tokens: {missing}"
        )
    return _TOKEN.sub(lambda m: tokens[m.group(1)], template)


# --- the PV ---------------------------------------------------------------------------


def persistent_volume(
    claim: Obj,
    storage_class: Obj,
    request: CreateRequest,
    created: CreatedVolume,
) -> Obj:
    """The PV for the ``created`` volume, bound to ``claim`` (external-provisioner ``Provision``
    plus the library's claimRef, annotation, finalizer and class name).

    A capacity of 0 (unknown, allowed by CSI) becomes the requested size; a
    smaller one than requested is refused (the caller deletes the volume).
    """
    capacity_bytes = created.capacity_bytes
    if capacity_bytes == 0:
        capacity_bytes = request.required_bytes
    elif capacity_bytes < request.required_bytes:
        raise errors.Internal(
            f"created volume capacity {capacity_bytes} less than requested capacity "
            f"{request.required_bytes}"
        )
    spec = claim.get("spec") or {}
    m = meta(claim)
    deletion = request.provisioner_secret
    csi: Obj = {
        "driver": storage_class["provisioner"],
        "volumeHandle": created.volume_id,
        "volumeAttributes": dict(created.volume_context),
    }
    if spec.get("volumeMode") != "Block" and request.fs_type:
        csi["fsType"] = request.fs_type
    if request.node_publish_secret is not None:
        csi["nodePublishSecretRef"] = request.node_publish_secret.as_dict()
    for kind, pv_field in (
        ("ControllerPublish", "controllerPublishSecretRef"),
        ("NodeStage", "nodeStageSecretRef"),
        ("ControllerExpand", "controllerExpandSecretRef"),
        ("NodeExpand", "nodeExpandSecretRef"),
    ):
        ref = request.other_secrets.get(kind)
        if ref is not None:
            csi[pv_field] = ref.as_dict()
    reclaim = storage_class.get("reclaimPolicy") or "Delete"
    pv_spec: Obj = {
        "accessModes": list(spec.get("accessModes") or []),
        "capacity": {"storage": quantity.from_bytes(capacity_bytes)},
        "csi": csi,
        "persistentVolumeReclaimPolicy": reclaim,
        "storageClassName": claim_class(claim),
        "claimRef": {
            "kind": "PersistentVolumeClaim",
            "apiVersion": "v1",
            "namespace": m.get("namespace"),
            "name": m.get("name"),
            "uid": m.get("uid"),
            "resourceVersion": m.get("resourceVersion"),
        },
    }
    if storage_class.get("mountOptions"):
        pv_spec["mountOptions"] = list(storage_class["mountOptions"])
    if spec.get("volumeMode"):
        pv_spec["volumeMode"] = spec["volumeMode"]
    pv_meta: Obj = {
        "name": request.name,
        "annotations": {
            ANN_PROVISIONED_BY: storage_class["provisioner"],
            ANN_DELETION_SECRET_NAME: deletion.name if deletion else "",
            ANN_DELETION_SECRET_NAMESPACE: deletion.namespace if deletion else "",
        },
    }
    if reclaim == "Delete":
        pv_meta["finalizers"] = [FINALIZER]
    return {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": pv_meta, "spec": pv_spec}


# --- PVs ------------------------------------------------------------------------------


def is_ours(pv: Obj, driver: str) -> bool:
    """Provisioned by ``driver`` (annotation), or a static PV of ``driver``'s (library
    ``isProvisionerForVolume``)."""
    anns = annotations_of(pv)
    if ANN_PROVISIONED_BY in anns:
        return driver in (anns[ANN_PROVISIONED_BY], anns.get(ANN_MIGRATED_TO))
    csi = (pv.get("spec") or {}).get("csi")
    if csi is not None:
        return bool(csi.get("driver") == driver)
    return anns.get(ANN_MIGRATED_TO) == driver


def finalizers_wanted(pv: Obj) -> list[str] | None:
    """The PV's finalizer list after adding or removing ours, or None when unchanged
    (library ``handleProtectionFinalizer``: added to Bound PVs with reclaim Delete that
    are not being deleted; removed when the policy is Retain or Recycle)."""
    finalizers = list(meta(pv).get("finalizers") or [])
    reclaim = (pv.get("spec") or {}).get("persistentVolumeReclaimPolicy")
    phase = (pv.get("status") or {}).get("phase")
    if (
        reclaim == "Delete"
        and not meta(pv).get("deletionTimestamp")
        and phase == "Bound"
        and FINALIZER not in finalizers
    ):
        return [*finalizers, FINALIZER]
    if reclaim in ("Retain", "Recycle") and FINALIZER in finalizers:
        return [f for f in finalizers if f != FINALIZER]
    return None


def should_delete(pv: Obj) -> bool:
    """Whether to delete the volume behind ``pv`` now (library ``shouldDelete``):
    Released, reclaim policy Delete, and not already cleaned up."""
    finalizers = meta(pv).get("finalizers") or []
    if FINALIZER not in finalizers and meta(pv).get("deletionTimestamp"):
        return False
    if (pv.get("status") or {}).get("phase") != "Released":
        return False
    return (pv.get("spec") or {}).get("persistentVolumeReclaimPolicy") == "Delete"


def deletion_secret(pv: Obj) -> SecretRef | None:
    anns = annotations_of(pv)
    name = anns.get(ANN_DELETION_SECRET_NAME, "")
    namespace = anns.get(ANN_DELETION_SECRET_NAMESPACE, "")
    return SecretRef(name, namespace) if name and namespace else None
