"""What RukPak says to users about bundles and installs: upstream's words and ours, once.

Sits at the bottom of the provisioner, beside the engine's errors: the format loaders
(``formats_plain``, ``formats_registry``), the install engine (``preflight``), the unpack
pod, the actuator, the CRD validator and both planners (``manager.plan`` for objects
created as v1alpha1, ``manager.inline`` for v1alpha2) take their condition reasons and
messages from here. A planner may decide which verdict applies (``install_failed`` is
asked with the API version), never how it reads.

Upstream's words are RukPak v0.16's (v1alpha1) and v0.24's (v1alpha2), as their
end-to-end suites check them. The rule for our own detail (the file, document and line
of a manifest, the object, the pod): it follows upstream's words and never comes between
upstream's prefix and its reason, so ``convert registry+v1 bundle to plain+v0 bundle:
AllNamespace install mode must be enabled`` reads as upstream wrote it, then
`` (manifests/csv.yaml document 1)``.
"""

from __future__ import annotations

# -- condition types and reasons (upstream's, v1alpha1 and v1alpha2 alike) ---------------

UNPACKED = "Unpacked"
HAS_VALID_BUNDLE = "HasValidBundle"
INSTALLED = "Installed"
HEALTHY = "Healthy"

UNPACK_PENDING = "UnpackPending"
UNPACKING = "Unpacking"
UNPACK_SUCCESSFUL = "UnpackSuccessful"
UNPACK_FAILED = "UnpackFailed"
INSTALLATION_SUCCEEDED = "InstallationSucceeded"
INSTALL_FAILED = "InstallFailed"
ERROR_GETTING_RELEASE_STATE = "ErrorGettingReleaseState"
"""v0.24's reason when the install cannot even be planned: its kinds are not served."""
INSTALLATION_STATUS_FALSE = "InstallationStatusFalse"
"""``Healthy``'s reason while ``Installed`` is False for a failure (upstream's
``setInstalledAndHealthyFalse``)."""
REASON_HEALTHY = "Healthy"
REASON_UNHEALTHY = "Unhealthy"

# ours, where upstream has no word
INSTALL_PENDING = "InstallPending"
NOT_INSTALLED = "NotInstalled"
HEALTH_UNREADABLE = "HealthUnreadable"
"""``Healthy`` Unknown: the deployment's account may not read a kind it installed
(upstream reads as the manager itself and never meets it)."""

Verdict = tuple[str, str, str]
"""(status, reason, message) of one condition."""

# -- prefixes upstream puts before its reasons -------------------------------------------

SOURCE_PREFIX = "source bundle content: "
"""A source whose content cannot be had (v0.24's unpacker; v0.16's configMaps source)."""
IMAGE_DESCRIPTOR = "error fetching image descriptor: "
"""An image reference the registry does not resolve (v0.24's image source)."""
MANIFESTS_PREFIX = "get objects from bundle manifests: "
"""A plain+v0 bundle whose objects cannot be read (upstream's ``ValidateBundle``)."""
CONVERT_PREFIX = "convert registry+v1 bundle to plain+v0 bundle: "
"""Every registry+v1 conversion failure."""
REQUIRED_RESOURCE = "required resource not found: "
"""An install that meets kinds the cluster does not serve (v0.16's
``errRequiredResourceNotFound``)."""
ENSURE_CRDS = "ensure CRDs are installed first"
"""What helm adds to a kind it cannot map; upstream v0.24's suite checks it."""

# -- a plain+v0 bundle -------------------------------------------------------------------

MANIFESTS_DIR = "manifests"
MISSING_MANIFESTS = f"{MANIFESTS_PREFIX}readdir {MANIFESTS_DIR}: file does not exist"
ZERO_OBJECTS = (
    "invalid bundle: found zero objects: plain+v0 bundles are required to contain at least "
    "one object"
)
_JSON_TYPES: dict[type, str] = {
    str: "string",
    int: "number",
    float: "number",
    bool: "bool",
    list: "array",
}


def go_quote(text: str) -> str:
    """``text`` quoted as Go's ``%q`` quotes it (for the plain strings paths are)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def subdirectory(rel: str, *, prefix: str = MANIFESTS_PREFIX) -> str:
    """A directory inside ``manifests/`` (``rel`` is ``manifests/NAME``)."""
    return (
        f"{prefix}subdirectories are not allowed within the {go_quote(MANIFESTS_DIR)} "
        f"directory of the bundle image filesystem: found {go_quote(rel)}"
    )


def not_an_object(file: str, value: object, where: str) -> str:
    """A document that is not a mapping (a dotfile of text, a list): how Go's decoder
    refuses it, then ``where`` (the document and line) in our words. The plain loader puts
    ``MANIFESTS_PREFIX`` before it, the registry+v1 loader ``CONVERT_PREFIX``."""
    kind = _JSON_TYPES.get(type(value), "string")
    return (
        f"unable to decode {go_quote(file)}: json: cannot unmarshal {kind} "
        f"into Go value of type map[string]interface {{}} ({where})"
    )


# -- a registry+v1 bundle ----------------------------------------------------------------


def conversion_failed(reason: str, where: str = "") -> str:
    """A registry+v1 conversion failure: upstream's prefix, its reason, then ours."""
    return f"{CONVERT_PREFIX}{reason}" + (f" ({where})" if where else "")


# -- sources -----------------------------------------------------------------------------


def unresolved(source_type: object, ref: str, detail: str, where: str = "") -> str:
    """A source that could not be pinned (its server did not answer, a tag that does not
    exist): the same words for a Bundle and a v1alpha2 BundleDeployment."""
    if source_type == "image":
        named = detail if ref in detail else f"{ref}: {detail}"
        return f"{SOURCE_PREFIX}{IMAGE_DESCRIPTOR}{named}{where}"
    return f"{SOURCE_PREFIX}cannot resolve {ref}: {detail}{where}"


def source_refused(detail: str, where: str = "") -> str:
    """A source the user must fix (a missing ConfigMap, branch or Secret)."""
    return f"{SOURCE_PREFIX}{detail}{where}"


# -- installs ----------------------------------------------------------------------------


def unknown_kinds(unknown: dict[tuple[str, str], str]) -> str:
    """Every kind the API server does not serve, keyed by (apiVersion, kind), each with
    where the bundle uses it: upstream's reason first, in the API machinery's words."""
    named = "; ".join(
        f'no matches for kind "{kind}" in version "{api_version}" ({where})'
        for (api_version, kind), where in sorted(unknown.items())
    )
    return f"{REQUIRED_RESOURCE}{named}; {ENSURE_CRDS}"


def install_failed(version: str, pod: str, failure: str) -> Verdict:
    """``Installed`` after a failed instance run: InstallFailed with the run's message;
    a v1alpha2 object whose kinds are not served reads as v0.24 reports it
    (ErrorGettingReleaseState), a v1alpha1 object as v0.16 (InstallFailed)."""
    reason = INSTALL_FAILED
    if version == "v1alpha2" and REQUIRED_RESOURCE in failure:
        reason = ERROR_GETTING_RELEASE_STATE
    return "False", reason, f"instance pod {pod} failed: {failure}"


FAILED_INSTALL_REASONS = frozenset({INSTALL_FAILED, ERROR_GETTING_RELEASE_STATE})


def installation_succeeded(bundle: str) -> str:
    return f"Instantiated bundle {bundle} successfully"


def healthy_unknown() -> Verdict:
    return "Unknown", NOT_INSTALLED, "health is known once the bundle is installed"


def healthy_unreadable(why: str) -> Verdict:
    """``Healthy`` while a kind the bundle installed cannot be read as its account."""
    return "Unknown", HEALTH_UNREADABLE, why


def healthy_when_failed() -> Verdict:
    """``Healthy`` while ``Installed`` is False for a failure (upstream sets both)."""
    return "False", INSTALLATION_STATUS_FALSE, "Installed condition is false"


# -- the CRD validator -------------------------------------------------------------------

CRD_VALIDATION_ANNOTATION = "core.rukpak.io/safe-crd-upgrade-validation"
CRD_VALIDATION_DISABLED = "false"
"""Upstream's opt-out of the CRD validator, which its denial names (ours is honoured too)."""


def crd_denied(operation: str, name: str, reasons: list[str]) -> str:
    """The CRD validator's denial, as upstream's crdvalidator words it (its handler's
    prefix around ``internal/crd``'s error), then each reason, ``; ``-separated."""
    return (
        f'failed to validate safety of {operation} for CRD "{name}" (NOTE: to disable this '
        f'validation, set the "{CRD_VALIDATION_ANNOTATION}" annotation to '
        f'"{CRD_VALIDATION_DISABLED}"): error validating existing CRs against new CRD\'s '
        f'schema for "{name}": ' + "; ".join(reasons)
    )


def stored_versions_removed(versions: list[str]) -> str:
    """A new CRD that drops versions its live one lists in ``status.storedVersions``."""
    return f"cannot remove stored versions [{' '.join(sorted(versions))}]"


def existing_invalid(namespace: str, name: str, version: str, field_errors: list[str]) -> str:
    """An existing custom resource the new schema of ``version`` refuses: upstream's words,
    the field errors aggregated as Go's ``ToAggregate`` prints them."""
    detail = field_errors[0] if len(field_errors) == 1 else f"[{', '.join(field_errors)}]"
    return (
        f"existing custom object {namespace}/{name} failed validation for new schema "
        f"version {version}: {detail}"
    )
