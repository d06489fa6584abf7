"""The planner of BundleDeployments created as v1alpha2: content named inline, no Bundles.

Sits beside ``plan`` (objects created as v1alpha1, whose template generates Bundles)
under the controller, which picks the planner by ``conversion.origin``; both hand their
actions to ``actuate``. Pure: it never talks to the API nor reads the clock
(``Observed.now``). The flow for a live BD:

1. add the uninstall finalizer (deletion runs, paused or not, as ``plan`` runs it);
2. refuse what cannot be installed, in upstream's words where upstream has them: a
   source type we do not fetch, and under ``spec.requireImmutableRefs`` an image tag, a
   git branch or tag, an http URL without a content digest;
3. pin the source (``ResolveSource``): ``status.resolvedSource`` and the annotation
   ``PIN_ANNOTATION`` (the generation it was pinned for, and when). A pin holds until the
   generation changes or, with ``spec.pollInterval``, until that interval passed; never
   on a resync, so nothing pivots silently;
4. under ``spec.paused``, preview the pin instead (``_plan_preview``) and install it only
   once approved; a reviewed pin holds when only ``paused`` changed (``approval``);
   otherwise install the pinned content with run-to-completion instance pods (``runs``), the
   revision named ``<bd>-<hash of the pin and format>``; the instance pod mounts the pin
   as its CSI volume, nothing is copied through the API server;
5. undo drift and damp fights exactly as ``plan`` does;
6. write the status: ``Unpacked`` (UnpackPending until pinned, Unpacking until the
   instance mounted the content, UnpackSuccessful; UnpackFailed prefixed
   ``source bundle content: ``), ``HasValidBundle``, ``Installed``, ``Healthy``, and
   ``FieldConflict`` once a fight happened, ``Drifted`` once drift was restored.
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import replace
from typing import Any

from provisioner.engine.bundle import words
from provisioner.engine.objects import Obj, condition, json_annotation, meta_of
from provisioner.manager import conversion, model
from provisioner.manager.model import Settings
from provisioner.manager.planning import approval, generate, plan, revisions, runs, sources
from provisioner.manager.planning.actions import (
    Action,
    AddFinalizer,
    CreatePod,
    DeletePod,
    Requeue,
    ResolveSource,
    SetRollback,
)

UNPACKED = "Unpacked"
VERIFIED = model.VERIFIED
"""Written with the pin by ``actuate.resolve_source`` (``signatures``), carried over here."""
PIN_ANNOTATION = "core.rukpak.io/pinned"
"""``{"generation": G, "at": RFC 3339}``: which generation ``status.resolvedSource`` pins."""
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def seconds_of(text: object) -> float | None:
    """Seconds of a Go duration (``90s``, ``10m``, ``1h30m``, ``500ms``); None if not one."""
    value = str(text or "")
    if not value or _DURATION.sub("", value):
        return None
    return sum(float(n) * _UNITS[unit] for n, unit in _DURATION.findall(value))


def pin_of(bd: Obj) -> tuple[int, str] | None:
    """(generation, time) the recorded pin was made for; None when there is none."""
    doc = json_annotation(bd, PIN_ANNOTATION)
    if not isinstance(doc, dict) or not isinstance(doc.get("generation"), int):
        return None
    return int(doc["generation"]), str(doc.get("at") or "")


def pin_annotation(generation: int, now: str) -> str:
    return json.dumps({"generation": generation, "at": now}, separators=(",", ":"))


def mutable_ref(source: Obj) -> str | None:
    """Why ``source`` names something that can change (``requireImmutableRefs``); None
    when it names content by digest or commit."""
    kind = source.get("type")
    spec: Any = source.get(str(kind)) if isinstance(kind, str) else None
    spec = spec if isinstance(spec, dict) else {}
    if kind == "image":
        ref = str(spec.get("ref") or "")
        if not model.is_digest_ref(ref):
            return f'image reference "{ref}" is a tag: name a digest (repository@sha256:...)'
    if kind == "git":
        ref = spec.get("ref") if isinstance(spec.get("ref"), dict) else {}
        for key in ("branch", "tag"):
            if ref.get(key):
                return f'git {key} "{ref[key]}" can move: name a commit (ref.commit)'
    if kind == "http":
        url = str(spec.get("url") or "")
        if "#sha256=" not in url:
            return f'http URL "{url}" names no content digest: append #sha256=<hex of the tarball>'
    return None


def revision_name(bd: Obj, resolved: Obj, bundle_format: str) -> str:
    """What the install record calls the installed content and configuration:
    ``<bd>-<hash>`` (``revisions``: a change of either is a new revision)."""
    config = revisions.config_of(bd.get("spec") or {})
    digest = model.stable_hash(
        [sources.stored(resolved), bundle_format, *([config] if config else [])], 10
    )
    return f"{model.name_of(bd)}-{digest}"


Entries = tuple[tuple[str, Obj], ...]
"""(destination, source) of each source: one at "" for ``spec.source``."""


def entries_of(spec: Obj) -> Entries:
    """The sources ``spec`` names (``source`` or ``sources``), each with its destination."""
    source = spec.get("source")
    if isinstance(source, dict):
        return (("", source),)
    out: list[tuple[str, Obj]] = []
    for entry in spec.get("sources") or []:
        if isinstance(entry, dict):
            rest = {k: v for k, v in entry.items() if k != "destination"}
            out.append((str(entry.get("destination") or ""), rest))
    return tuple(out)


def _destination_problem(entries: Entries) -> str | None:
    """Why the destinations of several sources cannot be mounted side by side."""
    clean = [posixpath.normpath(d.strip("/")) if d.strip("/") else "." for d, _ in entries]
    for index, path in enumerate(clean):
        if path == "." or path.startswith(".."):
            return (
                f"spec.sources[{index}].destination {entries[index][0]!r} must name a "
                "directory below the bundle root"
            )
        for other in clean[index + 1 :]:
            if other == path or other.startswith(path + "/") or path.startswith(other + "/"):
                return (
                    f"destinations {path!r} and {other!r} overlap: each source is its own "
                    "read-only volume, so no destination may be inside another"
                )
    return None


def _refusal(spec: Obj, entries: Entries) -> str | None:
    if not entries:
        return "spec.source or spec.sources must name the content"
    if len(entries) > 1 or entries[0][0]:
        problem = _destination_problem(entries)
        if problem is not None:
            return problem
    for _, source in entries:
        unsupported = sources.unsupported(source)
        if unsupported is not None:
            return unsupported
        if spec.get("requireImmutableRefs") and (why := mutable_ref(source)) is not None:
            return words.source_refused(f"spec.requireImmutableRefs is set: {why}")
    return None


def items_annotation(index: int) -> str:
    """Where the ConfigMap items of ``spec.sources[index]`` are recorded."""
    return f"{sources.ITEMS_ANNOTATION}-{index}"


def pinned_sources(bd: Obj, entries: Entries) -> Obj | None:
    """What ``entries`` are pinned to (``sources.several`` for ``spec.sources``); None
    until every one is pinned."""
    if len(entries) == 1 and not entries[0][0]:
        return sources.pinned(bd)
    recorded = (bd.get("status") or {}).get("resolvedSources")
    if not isinstance(recorded, list) or len(recorded) != len(entries):
        return None
    annotations = meta_of(bd).get("annotations") or {}
    out: list[tuple[str, Obj]] = []
    for index, ((destination, _), entry) in enumerate(zip(entries, recorded, strict=True)):
        if not isinstance(entry, dict) or entry.get("destination") != destination:
            return None
        view: Obj = {
            "metadata": {
                "annotations": {sources.ITEMS_ANNOTATION: annotations.get(items_annotation(index))}
            },
            "status": {"resolvedSource": {k: v for k, v in entry.items() if k != "destination"}},
        }
        one = sources.pinned(view)
        if one is None:
            return None
        out.append((destination, one))
    return sources.several(out)


def _pin_current(
    bd: Obj, spec: Obj, now: str, *, bundle_format: str, installed: str | None
) -> tuple[bool, float | None]:
    """(whether the recorded pin holds, seconds until ``pollInterval`` re-pins). A pin its
    preview reviewed holds across a change of ``paused`` alone, and is installed before
    ``pollInterval`` moves it (``approval``)."""
    pin = pin_of(bd)
    generation = int(meta_of(bd).get("generation") or 0)
    resolved = pinned_sources(bd, entries_of(spec))
    if pin is None or resolved is None:
        return False, None
    revision = revision_name(bd, resolved, bundle_format)
    kept = approval.reviewed(bd, revision)
    if pin[0] != generation and not kept:
        return False, None
    held = spec.get("upgradePolicy") == approval.APPROVE_ESCALATIONS  # polled on: may move to a fix
    if kept and not spec.get("paused") and installed != revision and not held:
        return True, None
    interval = seconds_of(spec.get("pollInterval"))
    if interval is None:
        return True, None
    spent = model.seconds_between(pin[1], now)
    if spent is None:
        return False, None
    left = interval - spent
    return (True, left) if left > 0 else (False, None)


def _mounted(pods: tuple[Obj, ...], revision: str) -> bool:
    """Whether an instance run of ``revision`` got its volume (the pod ran)."""
    for pod in pods:
        if (meta_of(pod).get("annotations") or {}).get(model.BUNDLE_ANNOTATION) != revision:
            continue
        if runs.phase(pod) in ("Running", "Succeeded", "Failed"):
            return True
    return False


def plan_inline(bd: Obj, observed: plan.Observed, *, settings: Settings) -> list[Action]:
    """Everything to do, in order, to move ``bd`` towards its spec (see the module doc)."""
    meta = meta_of(bd)
    spec = bd.get("spec") or {}
    claimed = model.FINALIZER in (meta.get("finalizers") or [])
    bundle_format = model.bundle_format(conversion.class_of(spec))
    if bundle_format is None and not claimed:
        return []  # another provisioner's BundleDeployment
    if meta.get("deletionTimestamp"):
        return list(plan.plan_deletion(bd, observed, settings))
    actions: list[Action] = []
    if not claimed:
        actions.append(AddFinalizer())
    entries = entries_of(spec)
    generation = int(meta.get("generation") or 0)
    refusal = (
        f"provisioner class {conversion.class_of(spec)!r} is not handled here"
        if bundle_format is None
        else _refusal(spec, entries)
    )
    if refusal is not None:
        failed: plan.Verdict = ("False", "UnpackFailed", refusal)
        verdicts = {UNPACKED: failed, plan.HAS_VALID_BUNDLE: failed}
        installed = runs.decide(
            bd, None, observed.pods, observed.record, (), settings=settings, now=observed.now
        ).installed
        verdicts[plan.INSTALLED] = installed
        verdicts[plan.HEALTHY] = plan.healthy(observed, installed)
        if (checked := plan.conditions_of(bd).get(VERIFIED)) is not None:
            verdicts[VERIFIED] = checked
        return actions + plan.status_actions(bd, "", verdicts, observed.now)
    assert bundle_format is not None
    kept = revisions.of_status(bd)
    rollback = revisions.rollback_of(bd)
    rolled_to = revisions.find(kept, rollback.revision) if rollback is not None else None
    rolled_pin = revisions.decode_pin(rolled_to.source) if rolled_to is not None else None
    poll: float | None = None
    live = observed.record.bundle if observed.record is not None else None
    if rollback is not None and rolled_to is not None and rolled_pin is not None:
        # the kept pin, as it was: nothing is resolved, no server is asked
        target = runs.Target(rolled_to.name, rolled_pin, prefer_nodes=rolled_to.nodes)
        bd_run = revisions.with_config(bd, rolled_to.config)
    else:
        rollback = rolled_to = None
        current, poll = _pin_current(
            bd, spec, observed.now, bundle_format=bundle_format, installed=live
        )
        if not current:
            return [*actions, ResolveSource(entries, settings.system_namespace, generation)]
        resolved = pinned_sources(bd, entries)
        assert resolved is not None
        target = runs.Target(revision_name(bd, resolved, bundle_format), resolved)
        bd_run = bd
    approved: plan.Verdict | None = None
    # paused: nothing applied but what was previewed and approved; upgradePolicy:
    # ApproveEscalations: an upgrade granting more waits for an approval
    upgrade = rolled_to is None and approval.gated(spec, live, target.bundle)
    if spec.get("paused") or upgrade:
        shown = _plan_preview(bd_run, observed, target, settings, upgrade=bool(upgrade))
        approved = _approved(bd_run, target, upgrade=bool(upgrade))
        if approved is None or approved[0] != "True":
            return actions + shown
        actions += [a for a in shown if isinstance(a, DeletePod)]
    more, decision = plan.run_install(bd_run, target, observed, settings)
    actions += more
    record = observed.record
    described = sources.describe(target.resolved)
    unpacked: plan.Verdict
    if rolled_to is not None:
        unpacked = (
            "True",
            "UnpackSuccessful",
            f"Successfully unpacked {described} (kept revision {rolled_to.number})",
        )
    elif (record is not None and record.bundle == target.bundle) or _mounted(
        observed.pods, target.bundle
    ):
        unpacked = ("True", "UnpackSuccessful", f"Successfully unpacked {described}")
    else:
        unpacked = ("False", "Unpacking", f"waiting for the instance run to mount {described}")
    valid: plan.Verdict = (
        unpacked
        if unpacked[0] == "True"
        else ("True", "UnpackPending", f"Waiting for {described} to be unpacked")
    )
    healthy = plan.healthy(observed, decision.installed)
    verdicts = {
        UNPACKED: unpacked,
        plan.HAS_VALID_BUNDLE: valid,
        plan.INSTALLED: decision.installed,
        plan.HEALTHY: healthy,
    }
    history, progress, more = _history(
        bd, spec, observed, target, decision, healthy, rollback, rolled_to
    )
    actions += more
    verdicts[revisions.PROGRESSING] = progress.verdict
    conflict = plan.field_conflict(bd, observed)
    if conflict is not None:
        verdicts[plan.FIELD_CONFLICT] = conflict
    drift = plan.drifted(bd, observed)
    if drift is not None:
        verdicts[plan.DRIFTED] = drift
    if approved is not None:
        verdicts[approval.APPROVED] = approved
    if (checked := plan.conditions_of(bd).get(VERIFIED)) is not None:
        verdicts[VERIFIED] = checked  # written with the pin (``signatures.verified``)
    address = model.content_url(settings.content_base_url, model.name_of(bd))
    extra: Obj = {"contentURL": address} if address else {}
    extra.update(history)
    actions += plan.status_actions(bd, "", verdicts, observed.now, extra)
    if poll is not None:
        actions.append(Requeue(poll, "re-resolving the source at spec.pollInterval"))
    if progress.left is not None:
        actions.append(Requeue(progress.left, "judging the progress deadline"))
    return actions


def _approved(bd: Obj, target: runs.Target, *, upgrade: bool) -> plan.Verdict | None:
    """``Approved`` once ``status.preview`` reviewed ``target`` (None before): True when it
    may be installed (``approval.verdict``)."""
    if not approval.reviewed(bd, target.bundle):
        return None
    shown = (bd.get("status") or {}).get("preview")
    rules = approval.new_rules_of(shown) if upgrade else None
    digests = approval.digests_of(target.resolved)
    return approval.verdict(bd, target.bundle, digests, model.name_of(bd), new_rules=rules)


def _plan_preview(
    bd: Obj,
    observed: plan.Observed,
    target: runs.Target,
    settings: Settings,
    *,
    upgrade: bool = False,
) -> list[Action]:
    """A paused BD: a preview run of ``target`` (``instance --preview``) whose summary goes to
    ``status.preview`` with the digests it reviewed, and ``Approved`` saying how to approve
    it (``approval``)."""
    want = generate.instance_run_pod(bd, target.bundle, target.resolved, settings, 0, preview=True)
    want_name = model.name_of(want)
    shown = (bd.get("status") or {}).get("preview")
    done = (
        isinstance(shown, dict)
        and shown.get("pod") == want_name
        and shown.get("specHash") == approval.spec_hash(bd.get("spec") or {})
    )  # (a change of the spec the pod does not show is recorded again, from the same run)
    digests = approval.digests_of(target.resolved)
    conditions = plan.conditions_of(bd)

    def judged(preview: Obj) -> dict[str, plan.Verdict]:
        if preview.get("error"):
            return conditions
        seen = {**bd, "status": {**(bd.get("status") or {}), "preview": preview}}
        verdict = _approved(seen, target, upgrade=upgrade)
        return conditions if verdict is None else {**conditions, approval.APPROVED: verdict}

    out: list[Action] = []
    found: Obj | None = None
    for pod in observed.pods:
        if (meta_of(pod).get("annotations") or {}).get(generate.PREVIEW_ANNOTATION) != "true":
            continue
        if model.name_of(pod) == want_name and not done:
            found = pod
        elif not runs.deleting(pod):
            out.append(DeletePod(settings.system_namespace, model.name_of(pod)))
    if done:
        assert isinstance(shown, dict)
        return [*out, *plan.status_actions(bd, "", judged(shown), observed.now)]
    if found is None:
        if observed.other_runs >= settings.max_concurrent_runs:
            return [*out, Requeue(runs.RUN_SLOT_WAIT, runs.SLOT_WAIT_WHY)]
        return [*out, CreatePod(want)]
    phase = runs.phase(found)
    if phase not in ("Succeeded", "Failed"):
        return out
    result: Obj = {
        "revision": target.bundle,
        "pod": want_name,
        "generation": meta_of(bd).get("generation"),
        **approval.preview_fields(bd, target.resolved),
    }
    event: plan.RecordEvent
    if phase == "Failed":
        result["error"] = runs.failure(found)
        event = plan.RecordEvent("Warning", "PreviewFailed", f"preview failed: {result['error']}")
    else:
        try:
            summary: Any = json.loads(runs.termination_message(found))
        except ValueError:
            summary = None
        if not isinstance(summary, dict):
            summary = {"error": "the preview run left no summary"}
        result.update({k: v for k, v in summary.items() if k not in result})
        escalations = summary.get("escalations") or []
        event = plan.RecordEvent(
            "Warning" if escalations else "Normal",
            "PreviewReady",
            f"preview of {sources.describe(target.resolved)}: {summary.get('objects', 0)} "
            f"objects, {len(escalations)} escalation(s) to review (rukpak preview shows all); "
            f"approve {', '.join(digests) or target.bundle} with rukpak approve, or set "
            "spec.paused to false",
        )
    return [
        *out,
        *plan.status_actions(bd, "", judged(result), observed.now, {"preview": result}),
        event,
    ]


def _history(
    bd: Obj,
    spec: Obj,
    observed: plan.Observed,
    target: runs.Target,
    decision: runs.Decision,
    healthy: plan.Verdict,
    rollback: revisions.Rollback | None,
    rolled_to: revisions.Revision | None,
) -> tuple[Obj, revisions.Progress, list[Action]]:
    """The revision fields of the status, ``Progressing``, and a rollback when the progress
    deadline passed under ``spec.rollbackOnFailure``."""
    record = observed.record
    generation = int(meta_of(bd).get("generation") or 0)
    was = (bd.get("status") or {}).get("installedRevision")
    kept = revisions.track(
        revisions.of_status(bd),
        name=target.bundle,
        resolved=target.resolved,
        generation=generation,
        now=observed.now,
        limit=revisions.limit_of(spec),
        keep=record.bundle if record is not None else "",
        asked=rolled_to is None,
        config=revisions.config_of(spec),
    )
    done = record is not None and record.bundle == target.bundle
    installed_now = done and decision.installed[0] == "True"
    outcome = (
        revisions.INSTALLED
        if installed_now
        else revisions.FAILED
        if decision.installed[1] in words.FAILED_INSTALL_REASONS
        else revisions.IN_PROGRESS
    )
    objects = len(record.applied) if done and record is not None and record.applied else None
    # the node of the run that wrote the record: the record says (or its pod, if there)
    ran_on = (record.node if done and record is not None else "") or next(
        (
            str((p.get("spec") or {}).get("nodeName") or "")
            for p in observed.pods
            if done and record is not None and model.name_of(p) == record.by
        ),
        "",
    )
    kept = revisions.settle(
        kept,
        name=target.bundle,
        outcome=outcome,
        objects=objects,
        installed=installed_now,
        was_installed=was if isinstance(was, int) else None,
        now=observed.now,
        node=ran_on,
    )
    installed = revisions.installed_of(kept, record.bundle) if record is not None else None
    newest = (
        max(kept, key=lambda r: r.number)
        if rolled_to is not None
        else next(r for r in kept if r.name == target.bundle)
    )
    deadline = revisions.deadline_of(spec)
    progress = revisions.progress(
        newest,
        ready=installed_now and healthy[0] == "True",
        why=healthy[2] if installed_now else decision.installed[2],
        deadline=deadline,
        now=observed.now,
        rollback=rollback,
        rolled_to=rolled_to,
    )
    more: list[Action] = []
    if progress.exceeded and rollback is None:
        kept = [replace(r, outcome=revisions.DEADLINE) if r is newest else r for r in kept]
    if progress.exceeded and rollback is None and spec.get("rollbackOnFailure"):
        back = installed if installed is not None and installed.name != target.bundle else None
        back = back or revisions.previous_of(kept, installed)
        if back is not None:
            more.append(SetRollback(back.number, generation, revisions.DEADLINE))
            more.append(
                plan.RecordEvent(
                    "Warning",
                    "RollingBack",
                    f"revision {newest.number} did not become Installed and Healthy within "
                    f"{deadline}s; rolling back to revision {back.number} from the node caches",
                )
            )
    return revisions.status_fields(kept, installed), progress, more


def unpacked_condition_message(bd: Obj) -> str:
    return str((condition(bd, UNPACKED) or {}).get("message") or "")


def unpacked_status(
    bd: Obj, verdict: plan.Verdict, now: str, *, resolved: Obj | None = None
) -> Obj:
    """The status fields a pin writes: ``Unpacked`` replaced among the conditions (the
    others kept), and ``resolvedSource`` (``resolvedSources`` for several) when pinned."""
    old = condition(bd, UNPACKED) or {}
    status, reason, message = verdict
    generation = int(meta_of(bd).get("generation") or 0)
    cond = {
        "type": UNPACKED,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": old.get("lastTransitionTime", now)
        if old.get("status") == status
        else now,
        "observedGeneration": generation,
    }
    others = [
        c
        for c in (bd.get("status") or {}).get("conditions") or []
        if isinstance(c, dict) and c.get("type") != UNPACKED
    ]
    out: Obj = {"conditions": [cond, *others]}
    if resolved is not None and resolved.get("type") == sources.MULTI:
        out["resolvedSources"] = [
            {**sources.stored(r), "destination": d} for d, r in sources.parts(resolved)
        ]
    elif resolved is not None:
        out["resolvedSource"] = sources.stored(resolved)
    return out
