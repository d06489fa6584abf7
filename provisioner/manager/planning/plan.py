"""The BundleDeployment planner: ``plan(bd, observed) -> actions``, pure.

Sits between the controller (which observes: the BD, the Bundles it owns,
its instance run pods, its install record, drift and the health of what its
inventory lists) and ``actuate`` (which performs the actions). It
never talks to the API and never reads the clock: ``Observed.now`` is the
time to stamp on condition transitions.

BDs of our provisioner classes (``model.CLASS_FORMATS``: plain+v0, registry+v1)
are planned; the template's class picks the format the instance loads (upstream
pairs a ``core-rukpak-io-plain`` BD with ``core-rukpak-io-registry`` Bundles, or
uses the registry class for both; either works here). The flow for a live BD
(DESIGN.md "Manager"):

1. add the uninstall finalizer;
2. generate the Bundle ``<bd>-<hash of template.spec>`` (a template change
   is a new name: the pivot);
3. wait for the Bundle controller (``bundleplan``) to resolve and unpack it:
   ``HasValidBundle`` follows its ``Unpacked`` condition in upstream's words
   (UnpackPending, UnpackFailed with the unpack message, UnpackSuccessful);
4. install the Bundle with a run-to-completion instance pod (``runs``); the
   run starts as soon as the Bundle's content is pinned, while its unpack pod
   still checks it (two pod starts overlap instead of following each other:
   the instance loads and checks the same content, and applies nothing from a
   bundle it refuses); the conditions report as if it started once Unpacked,
   and until the run is recorded the previous install stays as it was;
5. undo drift of the recorded install: re-apply our fields of drifted objects
   from their last good version (``Repair``, ``RestoreDrift``), damped when
   another writer keeps taking them back (``FieldConflict`` names the field and
   the writer; ``Drifted`` names who changed what); drift that cannot be restored so
   starts a run;
6. delete owned Bundles that are neither wanted, deployed nor active:
   ``status.activeBundle`` names a Bundle only once its install is recorded,
   so the old Bundle goes once the new one is installed;
7. write the status (``activeBundle``, conditions ``HasValidBundle``,
   ``Installed``, ``Healthy``, ``FieldConflict`` once a fight happened and ``Drifted``
   once drift was restored)
   when it changed, with an event per transition.

``spec.paused`` plans nothing. Deletion (a ``deletionTimestamp`` with our
finalizer) stops the instance runs first (so they cannot re-apply), waits for
its pods to go and for the BundleDeployments that depend on it, deletes the
Bundles, marks the install record for uninstall with the BD's
``deletionPolicy``, removes the finalizer, then uninstalls: the BD is gone no
later than its last object, as upstream's garbage collection has it, and the
controller finishes an uninstall cut short from the mark. Deletion runs even
when paused, or the BD could never go away.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

from provisioner.engine.apply import appliedrecord
from provisioner.engine.bundle import words
from provisioner.engine.health.health import Health as Health
from provisioner.engine.objects import Obj, condition, meta_of
from provisioner.manager import model
from provisioner.manager.model import Settings
from provisioner.manager.planning import bundleplan, dependencies, runs, sources
from provisioner.manager.planning.actions import Action as Action
from provisioner.manager.planning.actions import AddFinalizer as AddFinalizer
from provisioner.manager.planning.actions import CreateBundle as CreateBundle
from provisioner.manager.planning.actions import CreatePod as CreatePod
from provisioner.manager.planning.actions import DeleteBundle as DeleteBundle
from provisioner.manager.planning.actions import DeleteLease as DeleteLease
from provisioner.manager.planning.actions import DeletePod as DeletePod
from provisioner.manager.planning.actions import MarkUninstall as MarkUninstall
from provisioner.manager.planning.actions import RecordEvent as RecordEvent
from provisioner.manager.planning.actions import RemoveFinalizer as RemoveFinalizer
from provisioner.manager.planning.actions import Requeue as Requeue
from provisioner.manager.planning.actions import ResolveSource as ResolveSource
from provisioner.manager.planning.actions import RestoreDrift as RestoreDrift
from provisioner.manager.planning.actions import Revert as Revert
from provisioner.manager.planning.actions import SetRollback as SetRollback
from provisioner.manager.planning.actions import Uninstall as Uninstall
from provisioner.manager.planning.actions import WriteStatus as WriteStatus
from provisioner.manager.planning.generate import desired_bundle, instance_run_pod

HAS_VALID_BUNDLE = "HasValidBundle"
INSTALLED = "Installed"
HEALTHY = "Healthy"
FIELD_CONFLICT = "FieldConflict"
DRIFTED = "Drifted"
DELETING = "Deleting"
DEPENDENTS_POLL = 30.0
"""A deletion waiting for dependents looks again this often (their deletion wakes it)."""
FIGHT_THRESHOLD = 3
"""Re-applies of one BundleDeployment's drift inside the damper's window that make a fight."""
WARNING_REASONS = frozenset(
    {
        "AnotherWriter",
        "Fighting",
        "UnsupportedSource",
        "UnsupportedProvisionerClass",
        "ResolveFailed",
        "UnpackFailed",
        words.INSTALL_FAILED,
        words.ERROR_GETTING_RELEASE_STATE,
        "Unhealthy",
        "DependencyCycle",
        "ProgressDeadlineExceeded",
    }
)
POLL_SECONDS = 2.0


# -- what was observed -------------------------------------------------------------------


@dataclass(frozen=True)
class Repair:
    """Drift the manager undoes itself (``runwatch.Drift``), and the damper's say on it."""

    bodies: tuple[Obj, ...]
    reasons: tuple[str, ...]
    wait: float = 0.0
    """Seconds until the damper lets the next re-apply happen (0: now)."""


@dataclass(frozen=True)
class Observed:
    bundles: tuple[Obj, ...] = ()
    """Bundles labelled with the BD's name."""
    pods: tuple[Obj, ...] = ()
    """The BD's instance run pods."""
    record: runs.InstallRecord | None = None
    """The last finished install, from the inventory ConfigMap."""
    drift: tuple[str, ...] = ()
    """Why the recorded install no longer holds in a way only a run fixes (drifted objects
    with no good version kept, optional APIs that became served), confirmed by a fresh
    read; empty when it holds."""
    repair: Repair | None = None
    """Drifted objects the manager restores from their last good version."""
    fights: int = 0
    """Re-applies of this BD's drift inside the damper's window (a fight at
    ``FIGHT_THRESHOLD``)."""
    conflict: str = ""
    """Which fields another writer took, and who (for ``FieldConflict``)."""
    drifted: str = ""
    """Who changed what in the last drift restored (``drift_message``, for ``Drifted``)."""
    other_runs: int = 0
    """Instance runs of other BundleDeployments active now (``--max-concurrent-runs``)."""
    health: Health | None = None
    """Of the objects the inventory lists, as one ``Health``: ``ready`` when all are, else
    the ``reason`` names some that are not. None when nothing is installed (no inventory)
    or health was not read."""
    health_unreadable: str = ""
    """Why ``health`` is None though something is installed: a kind the deployment's
    account may not read (``HealthWatch.unknown_why``); "" otherwise."""
    dependencies: tuple[str, ...] = ()
    """``spec.dependsOn`` entries not Installed and Healthy yet, each in a few words."""
    cycle: str = ""
    """The cycle ``spec.dependsOn`` makes (``a -> b -> a``); "" when none."""
    dependents: tuple[str, ...] = ()
    """BundleDeployments whose ``spec.dependsOn`` names this one (deletion waits for them)."""
    revert: runs.Revert | None = None
    """How a rollback in force goes back to its revision without a run (the manager kept
    that revision's record and a good version of each of its objects); None otherwise."""
    now: str = "1970-01-01T00:00:00Z"


# -- judging what was observed -----------------------------------------------------------


def _unpacked_message(bundle: Obj) -> str:
    for cond in (bundle.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Unpacked":
            return str(cond.get("message") or "")
    return ""


def _failure(bundle: Obj) -> str | None:
    status = bundle.get("status") or {}
    if status.get("phase") != "Failing":
        return None
    for cond in status.get("conditions") or []:
        if cond.get("status") == "False" and cond.get("message"):
            return str(cond["message"])
    return "the Bundle failed"


Verdict = tuple[str, str, str]
"""(status, reason, message) of one condition."""


def healthy(observed: Observed, installed: Verdict) -> Verdict:
    """``Healthy`` beside ``installed``: False while the install failed (as upstream sets
    both), unknown until something is installed, else the health of what is."""
    if installed[0] == "False" and installed[1] in words.FAILED_INSTALL_REASONS:
        return words.healthy_when_failed()
    if observed.health is None and installed[0] == "True" and observed.health_unreadable:
        return words.healthy_unreadable(observed.health_unreadable)
    if observed.health is None or installed[0] != "True":
        return words.healthy_unknown()
    if observed.health.ready:
        return (
            "True",
            words.REASON_HEALTHY,
            observed.health.reason or ("every installed object is healthy"),
        )
    return "False", words.REASON_UNHEALTHY, observed.health.reason


# -- status ------------------------------------------------------------------------------


def _condition(kind: str, verdict: Verdict, old: Obj | None, now: str, generation: int) -> Obj:
    status, reason, message = verdict
    changed = old is None or old.get("status") != status
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now if changed or old is None else old.get("lastTransitionTime", now),
        "observedGeneration": generation,
    }


def _status(
    bd: Obj, active: str, verdicts: dict[str, Verdict], now: str, extra: Obj | None = None
) -> tuple[Obj, list[Action]]:
    old_status = bd.get("status") or {}
    old = {c.get("type"): c for c in old_status.get("conditions") or [] if isinstance(c, dict)}
    generation = int(meta_of(bd).get("generation") or 0)
    conditions = [
        _condition(kind, verdict, old.get(kind), now, generation)
        for kind, verdict in verdicts.items()
    ]
    status: Obj = {"observedGeneration": generation, "conditions": conditions, **(extra or {})}
    if active:
        status["activeBundle"] = active
    events: list[Action] = []
    for cond in conditions:
        before = old.get(cond["type"])
        keys = (
            ("status", "reason", "message")
            if cond["type"] == INSTALLED and cond["status"] == "True"
            else ("status", "reason")
        )
        # (a finished install's message says what it set aside: a change of it is news too)
        if before is None or any(before.get(k) != cond[k] for k in keys):
            kind: Literal["Normal", "Warning"] = (
                "Warning" if cond["reason"] in WARNING_REASONS else "Normal"
            )
            events.append(
                RecordEvent(
                    kind, cond["reason"], f"{cond['type']}={cond['status']}: {cond['message']}"
                )
            )
    if all(old_status.get(k) == v for k, v in status.items()):
        return status, []  # (a merge patch: fields we do not write stay as they are)
    return status, [WriteStatus(status), *events]


def status_actions(
    bd: Obj, active: str, verdicts: dict[str, Verdict], now: str, extra: Obj | None = None
) -> list[Action]:
    """The status write (and an event per condition transition) for ``verdicts`` and the
    ``extra`` fields; none when the status already says so."""
    return _status(bd, active, verdicts, now, extra)[1]


# -- the planner -------------------------------------------------------------------------


def plan(bd: Obj, observed: Observed, *, settings: Settings) -> list[Action]:
    """Everything to do, in order, to move ``bd`` towards its spec (see the module doc)."""
    meta = meta_of(bd)
    spec = bd.get("spec") or {}
    claimed = model.FINALIZER in (meta.get("finalizers") or [])
    if model.bundle_format(spec.get("provisionerClassName")) is None and not claimed:
        return []  # another provisioner's BundleDeployment: upstream filters by class
    if meta.get("deletionTimestamp"):
        return plan_deletion(bd, observed, settings)
    if spec.get("paused"):
        return []
    actions: list[Action] = []
    if not claimed:
        actions.append(AddFinalizer())

    bundles = {model.name_of(b): b for b in observed.bundles}
    wanted = model.bundle_name(bd)
    template_spec = (spec.get("template") or {}).get("spec") or {}
    source = template_spec.get("source") or {}
    bundle_class = template_spec.get("provisionerClassName") or spec.get("provisionerClassName")
    current = bundles.get(wanted)
    valid: Verdict
    target: runs.Target | None = None
    early: runs.Target | None = None  # the wanted Bundle, pinned, still being unpacked
    ours = " or ".join(sorted(model.CLASS_FORMATS))
    if model.bundle_format(spec.get("provisionerClassName")) is None:
        valid = (
            "False",
            "UnsupportedProvisionerClass",
            f"provisionerClassName {spec.get('provisionerClassName')!r} is not handled here; "
            f"use {ours}",
        )
    elif model.bundle_format(bundle_class) is None:
        valid = (
            "False",
            "UnsupportedProvisionerClass",
            f"template provisionerClassName {bundle_class!r} is not handled here (its Bundle "
            f"would never be unpacked); use {ours}",
        )
    elif (unsupported := sources.unsupported(source)) is not None:
        valid = ("False", "UnsupportedSource", unsupported)
    elif current is None:
        actions.append(CreateBundle(desired_bundle(bd)))
        valid = ("True", "UnpackPending", f"Waiting for the {wanted} Bundle to be unpacked")
    elif (failure := _failure(current)) is not None:
        why = (bundleplan.unpacked_condition(current) or {}).get("reason")
        reason = why if why == bundleplan.REASON_SIGNATURE else "UnpackFailed"
        valid = ("False", reason, f"Failed to unpack the {wanted} Bundle: {failure}")
    else:
        resolved = sources.pinned(current)
        if (current.get("status") or {}).get("phase") == "Unpacked" and resolved is not None:
            valid = ("True", "UnpackSuccessful", f"Successfully unpacked the {wanted} Bundle")
            target = runs.Target(wanted, resolved)
        else:
            waiting = _unpacked_message(current)
            valid = (
                "True",
                "UnpackPending",
                f"Waiting for the {wanted} Bundle to be unpacked"
                + (f": {waiting}" if waiting else ""),
            )
            if resolved is not None:
                early = runs.Target(wanted, resolved)

    previous = str((bd.get("status") or {}).get("activeBundle") or "")
    if target is None and observed.record is not None:
        # the wanted Bundle is not ready: keep the installed one applied
        old = bundles.get(observed.record.bundle)
        pinned = sources.pinned(old) if old is not None else None
        if pinned is not None:
            target = runs.Target(observed.record.bundle, pinned)
    if early is not None:
        # Its content is pinned: the run starts while the unpack pod checks it (the
        # instance loads and checks it too, and applies nothing from a bundle it refuses);
        # the conditions say what they said without the early run.
        more, _ = run_install(bd, early, observed, settings)
        _, decision = run_install(bd, target, observed, settings)
    else:
        more, decision = run_install(bd, target, observed, settings)
    actions += more
    deployed = target.bundle if target is not None else ""
    installed_verdict = decision.installed
    active = decision.active or previous
    if early is not None and observed.record is not None and observed.record.bundle == wanted:
        # installed early: ``Installed`` and ``activeBundle`` move once it is Unpacked
        installed_verdict = conditions_of(bd).get(INSTALLED) or (
            "False",
            "InstallPending",
            f"Waiting for the {wanted} Bundle to be unpacked",
        )
        active = previous
    for name in sorted(bundles):
        if name not in (wanted, deployed, active):
            actions.append(DeleteBundle(name))

    verdicts = {
        HAS_VALID_BUNDLE: valid,
        INSTALLED: installed_verdict,
        HEALTHY: healthy(observed, installed_verdict),
    }
    conflict = field_conflict(bd, observed)
    if conflict is not None:
        verdicts[FIELD_CONFLICT] = conflict
    drift = drifted(bd, observed)
    if drift is not None:
        verdicts[DRIFTED] = drift
    return actions + status_actions(bd, active, verdicts, observed.now)


def run_install(
    bd: Obj, target: runs.Target | None, observed: Observed, settings: Settings
) -> tuple[list[Action], runs.Decision]:
    """Restore drift of the recorded install when it is ``target``'s, then what the
    instance runs need (``runs.decide``): the actions, and the decision (``Installed``)."""
    actions: list[Action] = []
    record = observed.record
    gate = dependency_gate(observed, target)
    if gate is not None:
        return [], runs.Decision([], gate, record.bundle if record is not None else "")
    if (
        observed.repair is not None
        and target is not None
        and record is not None
        and record.bundle == target.bundle
    ):
        actions += repair_actions(bd, observed.repair, settings)
    reverting = revert_actions(bd, target, observed, settings)
    if reverting:
        pending = f"going back to {target.bundle if target else ''} without an instance run"
        installed = record.bundle if record is not None else ""
        return reverting, runs.Decision([], ("False", "InstallPending", pending), installed)
    decision = runs.decide(
        bd,
        target,
        observed.pods,
        record,
        observed.drift,
        settings=settings,
        now=observed.now,
        other_runs=observed.other_runs,
    )
    return actions + decision.actions, decision


def dependency_gate(observed: Observed, target: runs.Target | None) -> Verdict | None:
    """``Installed`` while ``spec.dependsOn`` holds the install of ``target`` back; None
    when nothing does (no dependencies, all ready, or ``target`` is installed already)."""
    if target is None or (observed.record is not None and observed.record.bundle == target.bundle):
        return None
    if observed.cycle:
        return (
            "False",
            "DependencyCycle",
            f"spec.dependsOn makes a cycle: {observed.cycle}; remove one of its edges",
        )
    if observed.dependencies:
        return (
            "False",
            "DependencyNotReady",
            "waiting for the BundleDeployments it depends on to be Installed and Healthy: "
            + "; ".join(observed.dependencies),
        )
    return None


def revert_actions(
    bd: Obj, target: runs.Target | None, observed: Observed, settings: Settings
) -> list[Action]:
    """A rollback's install without a run: the kept record of ``target`` adopted, its
    objects' good versions re-applied as the instance, what it lacks pruned; the record
    names the run that would have installed it, so ``runs.decide`` sees it installed. No
    actions unless ``observed.revert`` is for ``target``, another revision is recorded and
    no run of this BundleDeployment is active."""
    revert, record = observed.revert, observed.record
    if revert is None or target is None or revert.record.bundle != target.bundle:
        return []
    if record is None or record.bundle == target.bundle or revert.record.applied is None:
        return []
    if any(runs.is_active(p) for p in observed.pods):
        return []
    run = instance_run_pod(bd, target.bundle, target.resolved, settings, 0)
    adopted = replace(revert.record, by=model.name_of(run))
    refs = tuple(sorted(appliedrecord.ref_of(key) for key in revert.record.applied))
    return [
        Revert(
            revert.bodies,
            instance_user(bd, settings),
            revert.prune,
            refs,
            str((bd.get("spec") or {}).get("installNamespace") or ""),
            adopted.document(),
        ),
        RecordEvent(
            "Normal",
            "RevertedWithoutRun",
            f"went back to {target.bundle} from what the manager kept of it: re-applied "
            f"{len(revert.bodies)} object(s), pruned {len(revert.prune)}; no instance run",
        ),
    ]


def instance_user(bd: Obj, settings: Settings) -> str:
    """The user the BD's instance runs as: its ServiceAccount in the system namespace."""
    account = (bd.get("spec") or {}).get("serviceAccountName") or settings.service_account
    return f"system:serviceaccount:{settings.system_namespace}:{account}"


def repair_actions(bd: Obj, repair: Repair, settings: Settings) -> list[Action]:
    if repair.wait > 0:
        return [Requeue(repair.wait, "damping a fight over drifted fields")]
    more = f" (and {len(repair.reasons) - 3} more)" if len(repair.reasons) > 3 else ""
    return [
        RestoreDrift(repair.bodies, instance_user(bd, settings)),
        RecordEvent(
            "Normal",
            "DriftRestored",
            f"restored {len(repair.bodies)} drifted object(s) from their last applied "
            f"state: {'; '.join(repair.reasons[:3])}{more}",
        ),
    ]


def field_conflict(bd: Obj, observed: Observed) -> Verdict | None:
    """``FieldConflict``: True while drift of this BD keeps being re-applied (another writer
    takes our fields back); False once it stopped; None when no fight ever happened."""
    if observed.fights >= FIGHT_THRESHOLD:
        who = observed.conflict or "another writer keeps changing fields this bundle applies"
        return (
            "True",
            "AnotherWriter",
            f"{who}; re-applied {observed.fights} times in the last 10 minutes, backing off "
            "(remove the field from the bundle, or stop the other writer)",
        )
    if condition(bd, FIELD_CONFLICT) is None:
        return None
    return "False", "NoConflict", "no other writer keeps changing fields this bundle applies"


def drift_message(authors: tuple[str, ...] | list[str]) -> str:
    """``Drifted``'s message for a restore: who changed what (three at most), restored."""
    more = f" (and {len(authors) - 3} more)" if len(authors) > 3 else ""
    said = "; ".join(authors[:3]) or "objects this bundle applies were changed"
    return f"{said}{more}; restored"


def drifted(bd: Obj, observed: Observed) -> Verdict | None:
    """``Drifted``: True while the damper remembers a restore of this BD's drift (its
    window, 10 minutes), ``DriftCorrected`` naming who changed what, ``Fighting`` once the
    re-applies make a fight; False (``NoDrift``) after a quiet window; None when it never
    drifted. One condition per fight, so one event per transition, not one per write.
    Changes only to ignored fields (``spec.ignore``) never get here (``runwatch``)."""
    if observed.repair is not None or observed.fights > 0:
        said = observed.drifted or drift_message(())
        if observed.fights >= FIGHT_THRESHOLD:
            return (
                "True",
                "Fighting",
                f"{said}; changed again and re-applied {observed.fights} times in the last "
                "10 minutes, backing off (stop the other writer, or add the field to "
                "spec.ignore)",
            )
        return "True", "DriftCorrected", said
    if condition(bd, DRIFTED) is None:
        return None
    return "False", "NoDrift", "no drift of the installed objects in the last 10 minutes"


def plan_deletion(bd: Obj, observed: Observed, settings: Settings) -> list[Action]:
    if model.FINALIZER not in (meta_of(bd).get("finalizers") or []):
        return []
    if observed.pods:
        doomed = [p for p in observed.pods if not meta_of(p).get("deletionTimestamp")]
        stop: list[Action] = [
            DeletePod(str(meta_of(p).get("namespace") or ""), model.name_of(p)) for p in doomed
        ]
        return [*stop, Requeue(POLL_SECONDS, "waiting for the instance pods to stop")]
    if observed.dependents:
        names = ", ".join(observed.dependents)
        waiting: Verdict = (
            "True",
            "WaitingForDependents",
            f"waiting for the BundleDeployments that depend on this one to go first: {names}",
        )
        return [
            *status_actions(
                bd, _active(bd), {**conditions_of(bd), DELETING: waiting}, observed.now
            ),
            Requeue(DEPENDENTS_POLL, "waiting for dependents to be deleted"),
        ]
    policy: Literal["Delete", "Orphan"] = (
        "Orphan" if (bd.get("spec") or {}).get("deletionPolicy") == "Orphan" else "Delete"
    )
    # the BundleDeployment goes before its objects (as upstream's garbage collection has it):
    # the mark on the install record lets a later pass finish an uninstall cut short
    actions: list[Action] = [DeleteBundle(model.name_of(b)) for b in observed.bundles]
    actions += [
        MarkUninstall(policy, dependencies.depends_on(bd), instance_user(bd, settings)),
        RemoveFinalizer(),
        Uninstall(policy, instance_user(bd, settings)),
        DeleteLease(),
    ]
    return actions


def _active(bd: Obj) -> str:
    return str((bd.get("status") or {}).get("activeBundle") or "")


def conditions_of(bd: Obj) -> dict[str, Verdict]:
    """The BD's conditions as verdicts (kept as they are when one more is written)."""
    out: dict[str, Verdict] = {}
    for cond in (bd.get("status") or {}).get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type"):
            out[str(cond["type"])] = (
                str(cond.get("status") or "Unknown"),
                str(cond.get("reason") or ""),
                str(cond.get("message") or ""),
            )
    return out


@dataclass
class Summary:
    """For logs: how many actions of each kind a plan holds."""

    counts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, actions: list[Action]) -> Summary:
        out: dict[str, int] = {}
        for action in actions:
            out[type(action).__name__] = out.get(type(action).__name__, 0) + 1
        return cls(out)
