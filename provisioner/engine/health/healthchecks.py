"""Probe-shaped health checks from a BundleDeployment's ``spec.healthChecks``.

Sits beside ``health`` (readiness per kind) after apply. ``parse`` validates the
spec once (CEL compiled here; problems become a condition), ``evaluate`` runs one
probe of one check over the installed objects, and ``step`` advances every
check the way kubelet advances a pod's probes: no probe before the initial
delay, at most one per period, and a verdict that flips only after
``failureThreshold`` consecutive failures or ``successThreshold`` consecutive
successes. Pure apart from reading a monotonic clock to bound a probe: the
caller passes the live objects, the time and the probe state.

CEL is Google's C++ implementation (``cel-expr-python``) with the object bound
to ``object`` as in Kubernetes ValidatingAdmissionPolicy. Regular expressions
(``field.matches`` and CEL ``matches()``) are RE2, so they run in linear time.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from cel_expr_python import cel  # type: ignore[import-untyped]

from provisioner.engine.health.health import READY, Health
from provisioner.engine.objects import Obj, condition, labels_of, meta_of

MAX_CHECKS = 32
MAX_ASSERTIONS = 32
MAX_CEL_CHARS = 1024
MAX_CEL_COMPREHENSIONS = 4
"""Chained or nested macros multiply what an expression can build; four is plenty for checks."""
MAX_CEL_INPUT_BYTES = 256 * 1024
"""An object larger than this (JSON, without managedFields) is not handed to CEL."""
MAX_CEL_DEPTH = 100
"""Deeper objects are refused: the C++ converter recurses (and crashes) on very deep input."""
MAX_PATTERN_CHARS = 1024
MAX_INT32 = 2**31 - 1
SHOW_CHARS = 80

_CHECK_KEYS = {
    "name",
    "selector",
    "assertions",
    "initialDelaySeconds",
    "periodSeconds",
    "timeoutSeconds",
    "failureThreshold",
    "successThreshold",
}
_SELECTOR_KEYS = {"group", "kind", "name", "namespace", "matchLabels"}
_STATUSES = ("True", "False", "Unknown")
_MACRO = re.compile(r"\.\s*(all|exists|exists_one|map|filter)\s*\(")


@dataclass(frozen=True)
class Selector:
    """Which installed objects a check covers; an unset field matches anything."""

    group: str | None = None
    kind: str | None = None
    name: str | None = None
    namespace: str | None = None
    match_labels: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ConditionIs:
    type: str
    status: str = "True"


@dataclass(frozen=True)
class FieldEquals:
    path: str
    steps: tuple[str | int, ...]
    value: Any = field(hash=False)


@dataclass(frozen=True)
class FieldMatches:
    path: str
    steps: tuple[str | int, ...]
    pattern: str
    program: Any = field(compare=False, repr=False)


@dataclass(frozen=True)
class CelTrue:
    expression: str
    program: Any = field(compare=False, repr=False)


Assertion = ConditionIs | FieldEquals | FieldMatches | CelTrue


@dataclass(frozen=True)
class Check:
    """One entry of ``spec.healthChecks``; with no assertions it asks only that an object exists."""

    name: str
    selector: Selector
    assertions: tuple[Assertion, ...]
    initial_delay: int = 0
    period: int = 10
    timeout: int = 1
    failure_threshold: int = 3
    success_threshold: int = 1


@dataclass(frozen=True)
class Result:
    """One probe of one check: ``ok`` when every selected object passed every assertion."""

    ok: bool
    failures: tuple[str, ...] = ()


@dataclass
class ProbeState:
    """Kubelet's per-probe bookkeeping; ``verdict`` is None until a threshold decides it."""

    successes: int = 0
    failures: int = 0
    last_probe: float | None = None
    verdict: bool | None = None
    last_failures: tuple[str, ...] = ()


class _Problem(Exception):
    """A spec error found while parsing: ``where`` is relative to the check."""

    def __init__(self, where: str, what: str) -> None:
        super().__init__(f"{where}: {what}")
        self.where, self.what = where, what


# --- parsing -------------------------------------------------------------------------------


def parse(spec_checks: object) -> tuple[list[Check], list[str]]:
    """The valid checks of ``spec.healthChecks`` and one message per problem.

    A check with any problem is left out whole; an absent field (None) is no checks.
    """
    if spec_checks is None:
        return [], []
    if not isinstance(spec_checks, list):
        return [], [f"spec.healthChecks: must be a list of checks, not {_kind(spec_checks)}"]
    problems: list[str] = []
    if len(spec_checks) > MAX_CHECKS:
        problems.append(f"spec.healthChecks: at most {MAX_CHECKS} checks, not {len(spec_checks)}")
    checks: list[Check] = []
    names: set[str] = set()
    for index, raw in enumerate(spec_checks[:MAX_CHECKS]):
        base = f"spec.healthChecks[{index}]"
        try:
            check = _check(index, raw)
        except _Problem as problem:
            sep = "." if problem.where else ""
            problems.append(f"{base}{sep}{problem.where}: {problem.what}")
            continue
        if check.name in names:
            problems.append(f"{base}.name: {check.name!r} is used by an earlier check")
            continue
        names.add(check.name)
        checks.append(check)
    return checks, problems


def _check(index: int, raw: object) -> Check:
    if not isinstance(raw, dict):
        raise _Problem("", f"must be an object, not {_kind(raw)}")
    _no_unknown_keys(raw, _CHECK_KEYS, "")
    name = raw.get("name", f"check-{index}")
    if not isinstance(name, str) or not name:
        raise _Problem("name", f"must be a non-empty string, not {_show(name)}")
    assertions = raw.get("assertions", [])
    if not isinstance(assertions, list):
        raise _Problem("assertions", f"must be a list, not {_kind(assertions)}")
    if len(assertions) > MAX_ASSERTIONS:
        raise _Problem("assertions", f"at most {MAX_ASSERTIONS}, not {len(assertions)}")
    return Check(
        name=name,
        selector=_selector(raw.get("selector", {})),
        assertions=tuple(_assertion(f"assertions[{i}]", a) for i, a in enumerate(assertions)),
        initial_delay=_seconds(raw, "initialDelaySeconds", 0, minimum=0),
        period=_seconds(raw, "periodSeconds", 10, minimum=1),
        timeout=_seconds(raw, "timeoutSeconds", 1, minimum=1),
        failure_threshold=_seconds(raw, "failureThreshold", 3, minimum=1),
        success_threshold=_seconds(raw, "successThreshold", 1, minimum=1),
    )


def _selector(raw: object) -> Selector:
    if raw is None:
        return Selector()
    if not isinstance(raw, dict):
        raise _Problem("selector", f"must be an object, not {_kind(raw)}")
    _no_unknown_keys(raw, _SELECTOR_KEYS, "selector")
    for key in ("group", "kind", "name", "namespace"):
        if key in raw and not isinstance(raw[key], str):
            raise _Problem(f"selector.{key}", f"must be a string, not {_show(raw[key])}")
    labels = raw.get("matchLabels") or {}
    if not isinstance(labels, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise _Problem("selector.matchLabels", "must map label names to string values")
    return Selector(
        group=raw.get("group"),
        kind=raw.get("kind"),
        name=raw.get("name"),
        namespace=raw.get("namespace"),
        match_labels=tuple(sorted(labels.items())),
    )


def _assertion(where: str, raw: object) -> Assertion:
    if not isinstance(raw, dict) or len(raw) != 1:
        raise _Problem(where, "must have exactly one of condition, field or cel")
    ((key, body),) = raw.items()
    if key == "condition":
        return _condition(f"{where}.condition", body)
    if key == "field":
        return _field(f"{where}.field", body)
    if key == "cel":
        return _cel(where, body)
    raise _Problem(where, f"unknown assertion {key!r} (want condition, field or cel)")


def _condition(where: str, raw: object) -> ConditionIs:
    if not isinstance(raw, dict):
        raise _Problem(where, f"must be an object, not {_kind(raw)}")
    _no_unknown_keys(raw, {"type", "status"}, where)
    kind, status = raw.get("type"), raw.get("status", "True")
    if not isinstance(kind, str) or not kind:
        raise _Problem(f"{where}.type", f"must be a non-empty string, not {_show(kind)}")
    if status not in _STATUSES:
        raise _Problem(f"{where}.status", f'must be "True", "False" or "Unknown", not {status!r}')
    return ConditionIs(kind, status)


def _field(where: str, raw: object) -> FieldEquals | FieldMatches:
    if not isinstance(raw, dict):
        raise _Problem(where, f"must be an object, not {_kind(raw)}")
    _no_unknown_keys(raw, {"path", "equals", "matches"}, where)
    path = raw.get("path")
    if not isinstance(path, str):
        raise _Problem(f"{where}.path", f"must be a string, not {_show(path)}")
    steps = _steps(f"{where}.path", path)
    if ("equals" in raw) == ("matches" in raw):
        raise _Problem(where, "needs exactly one of equals or matches")
    if "equals" in raw:
        return FieldEquals(path, steps, raw["equals"])
    pattern = raw["matches"]
    if not isinstance(pattern, str) or len(pattern) > MAX_PATTERN_CHARS:
        raise _Problem(f"{where}.matches", f"must be a string of at most {MAX_PATTERN_CHARS}")
    literal = json.dumps(pattern, ensure_ascii=False)
    program = _compile(f"{where}.matches", f"value.matches({literal})", _regex_env(), label="")
    _, error = _run(program, "value", "")
    if error is not None:
        raise _Problem(f"{where}.matches", error)
    return FieldMatches(path, steps, pattern, program)


def _cel(where: str, raw: object) -> CelTrue:
    if not isinstance(raw, str) or not raw.strip():
        raise _Problem(where, f"cel: must be a non-empty string, not {_show(raw)}")
    if len(raw) > MAX_CEL_CHARS:
        raise _Problem(where, f"cel: at most {MAX_CEL_CHARS} characters, not {len(raw)}")
    if len(_MACRO.findall(raw)) > MAX_CEL_COMPREHENSIONS:
        raise _Problem(where, f"cel: at most {MAX_CEL_COMPREHENSIONS} macros (all, exists, map…)")
    program = _compile(where, raw, _object_env())
    returns = program.return_type()
    if returns not in (cel.Type.BOOL, cel.Type.DYN):
        raise _Problem(where, f"cel: must evaluate to a bool, not {returns.name().lower()}")
    return CelTrue(raw, program)


@cache
def _object_env() -> Any:
    """CEL checks see the object as ``object``, a JSON map, as Kubernetes' policies do."""
    return cel.NewEnv(variables={"object": cel.Type.Map(cel.Type.STRING, cel.Type.DYN)})


@cache
def _regex_env() -> Any:
    return cel.NewEnv(variables={"value": cel.Type.STRING})


def _compile(where: str, source: str, env: Any, *, label: str = "cel: ") -> Any:
    if not _is_utf8(source):
        raise _Problem(where, f"{label}holds characters that are not valid UTF-8")
    try:
        return env.compile(source)
    except RuntimeError as err:
        raise _Problem(where, f"{label}{_cel_error(str(err))}") from None


def _run(program: Any, name: str, value: Any) -> tuple[Any, str | None]:
    """The value ``program`` gives with ``name`` bound to ``value``, or the error it hit."""
    try:
        outcome = program.eval(data={name: value})
    except (RuntimeError, TypeError, ValueError) as err:  # exhausted budgets, unconvertible input
        return None, _cel_error(str(err))
    if outcome.type() == cel.Type.ERROR:
        return None, _cel_error(outcome.value())
    return outcome.plain_value(), None


def _cel_error(text: object) -> str:
    """cel-cpp's status text, without status codes and the caret drawing."""
    text = re.sub(r"\s*\[[A-Z_]+\]$", "", str(text).strip())
    errors = re.findall(r"ERROR: <input>:(.*)", text)
    out = "; ".join(e.strip() for e in errors) if errors else re.sub(r"^[A-Z_]+: ", "", text)
    return _clip(out, 300)


def _seconds(raw: dict[str, Any], key: str, default: int, *, minimum: int) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _Problem(key, f"must be an integer, not {_show(value)}")
    if not minimum <= value <= MAX_INT32:
        raise _Problem(key, f"must be between {minimum} and {MAX_INT32}, not {value}")
    return value


def _no_unknown_keys(raw: dict[Any, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(str(k) for k in raw if k not in allowed)
    if unknown:
        want = ", ".join(sorted(allowed))
        raise _Problem(where, f"unknown field {unknown[0]!r} (want one of {want})")


_STEP = re.compile(r"\.([^.\[\]]+)|\[(-?\d+)\]|\['([^']*)'\]|\[\"([^\"]*)\"\]")


def _steps(where: str, path: str) -> tuple[str | int, ...]:
    """``.a.b[0]['x.y']`` -> ``("a", "b", 0, "x.y")``; the leading dot is optional."""
    if not path:
        raise _Problem(where, "must name a field, like .status.readyReplicas")
    text = path if path.startswith((".", "[")) else f".{path}"
    steps: list[str | int] = []
    at = 0
    while at < len(text):
        found = _STEP.match(text, at)
        if found is None:
            raise _Problem(where, f"cannot read {path!r} at {text[at : at + 10]!r}")
        key, index, single, double = found.groups()
        if index is not None:
            steps.append(int(index))
        else:
            steps.append(key if key is not None else single if single is not None else double)
        at = found.end()
    return tuple(steps)


# --- one probe -----------------------------------------------------------------------------


def selects(check: Check, obj: Obj) -> bool:
    """Whether ``obj`` is one of the objects ``check`` covers."""
    if not isinstance(obj, dict) or not isinstance(meta_of(obj), dict):
        return False
    sel = check.selector
    group = str(obj.get("apiVersion", "")).rpartition("/")[0]
    meta = meta_of(obj)
    labels = labels_of(obj) if isinstance(meta.get("labels"), dict) else {}
    return (
        (sel.group is None or sel.group == group)
        and (sel.kind is None or sel.kind == obj.get("kind"))
        and (sel.name is None or sel.name == meta.get("name"))
        and (sel.namespace is None or sel.namespace == (meta.get("namespace") or ""))
        and all(labels.get(k) == v for k, v in sel.match_labels)
    )


def evaluate(
    check: Check, objects: Iterable[Obj], *, clock: Callable[[], float] = time.monotonic
) -> Result:
    """One probe: every selected object against every assertion, within ``check.timeout``.

    A probe that runs past its timeout stops and fails, as kubelet's would.
    """
    started = clock()
    selected = [obj for obj in objects if selects(check, obj)]
    if not selected:
        return Result(False, (f"check {check.name}: no object matches the selector",))
    failures: list[str] = []
    for done, obj in enumerate(selected):
        if clock() - started > check.timeout:
            left = len(selected) - done
            failures.append(
                f"check {check.name}: probe timed out after {check.timeout}s"
                f" ({left} objects not checked)"
            )
            break
        for assertion in check.assertions:
            why = _failure(assertion, obj)
            if why is not None:
                failures.append(f"check {check.name}: {describe(obj)}: {why}")
    return Result(not failures, tuple(failures))


def describe(obj: Obj) -> str:
    """``Deployment ns/web``, or ``ClusterRole admin`` for cluster-scoped objects."""
    meta = meta_of(obj)
    where = f"{meta.get('namespace')}/" if meta.get("namespace") else ""
    return f"{obj.get('kind') or 'object'} {where}{meta.get('name') or '(unnamed)'}"


def _failure(assertion: Assertion, obj: Obj) -> str | None:
    """Why ``obj`` fails ``assertion``, or None when it holds."""
    match assertion:
        case ConditionIs(kind, want):
            status = obj.get("status")
            listed = isinstance(status, dict) and isinstance(status.get("conditions"), list)
            found = condition(obj, kind) if listed else None
            if found is None:
                return f"condition {kind} is missing (want {want})"
            got = found.get("status")
            if got == want:
                return None
            why = found.get("message") or found.get("reason")
            detail = f": {_clip(str(why), 200)}" if why else ""
            return f"condition {kind} is {got} (want {want}){detail}"
        case FieldEquals(path, steps, value):
            got, why = _lookup(obj, steps)
            if why is not None:
                return f"field {path} is {why} (want {_show(value)})"
            if _same(got, value):
                return None
            return f"field {path} is {_show(got)} (want {_show(value)})"
        case FieldMatches(path, steps, pattern, program):
            got, why = _lookup(obj, steps)
            want = f"(want a match for {_clip(pattern, SHOW_CHARS)})"
            if why is not None:
                return f"field {path} is {why} {want}"
            if isinstance(got, dict | list):
                return f"field {path} is {_kind(got)}, not a string {want}"
            matched, error = _run(program, "value", got if isinstance(got, str) else _text(got))
            if error is not None:
                return f"field {path} could not be matched: {error} {want}"
            return None if matched is True else f"field {path} is {_show(got)} {want}"
        case CelTrue(expression, program):
            return _cel_failure(expression, program, obj)
    return f"unknown assertion {assertion!r}"


def _lookup(obj: Obj, steps: tuple[str | int, ...]) -> tuple[Any, str | None]:
    """The value at ``steps``, or why there is none ("missing", "unreachable: …")."""
    here: Any = obj
    walked = ""
    for step in steps:
        if isinstance(step, int):
            if not isinstance(here, list):
                return None, f"unreachable: {walked or '.'} is {_kind(here)}, not a list"
            if not -len(here) <= step < len(here):
                return None, "missing"
            here, walked = here[step], f"{walked}[{step}]"
        else:
            if not isinstance(here, dict):
                return None, f"unreachable: {walked or '.'} is {_kind(here)}, not an object"
            if step not in here:
                return None, "missing"
            here, walked = here[step], f"{walked}.{step}"
    return here, None


def _cel_failure(expression: str, program: Any, obj: Obj) -> str | None:
    shown = f"cel `{_clip(expression, SHOW_CHARS)}`"
    data = _cel_input(obj)
    if isinstance(data, str):
        return f"{shown} not evaluated: {data}"
    value, error = _run(program, "object", data)
    if error is not None:
        return f"{shown} failed: {error}"
    if value is True:
        return None
    if value is False:
        return f"{shown} is false"
    return f"{shown} gave {_show(value)}, not a bool"


def _cel_input(obj: Obj) -> Obj | str:
    """``obj`` without managedFields, or why it is too big or deep to hand to CEL."""
    meta = meta_of(obj)
    if isinstance(meta, dict) and "managedFields" in meta:
        obj = {**obj, "metadata": {k: v for k, v in meta.items() if k != "managedFields"}}
    size, pending = 0, [(obj, 1)]
    while pending:
        value, depth = pending.pop()
        if depth > MAX_CEL_DEPTH:
            return f"object nests deeper than {MAX_CEL_DEPTH} levels"
        if isinstance(value, dict):
            size += 2 + sum(len(str(k)) + 4 for k in value)
            pending.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, list):
            size += 2 + len(value)
            pending.extend((v, depth + 1) for v in value)
        else:
            size += len(value) + 2 if isinstance(value, str) else 8
        if size > MAX_CEL_INPUT_BYTES:
            return f"object is larger than {MAX_CEL_INPUT_BYTES // 1024} KiB"
    return obj


def _same(got: Any, want: Any) -> bool:
    """JSON equality (``true`` is not ``1``), or equal text when one side is a string scalar."""
    try:
        if _json_equal(got, want):
            return True
    except RecursionError:
        return False
    scalars = (str, int, float, bool, type(None))
    return (
        isinstance(got, scalars)
        and isinstance(want, scalars)
        and (isinstance(got, str) or isinstance(want, str))
        and _text(got) == _text(want)
    )


def _json_equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict | list) or isinstance(b, dict | list):
        return False
    return bool(a == b)


# --- probing over time ---------------------------------------------------------------------


def step(
    checks: Sequence[Check],
    state: dict[str, ProbeState],
    objects: Sequence[Obj],
    *,
    now: float,
    installed_at: float,
) -> tuple[Health, float | None]:
    """Run the probes that are due at ``now``; the combined health and seconds to the next one.

    ``state`` (by check name) is advanced in place; entries of checks no longer in
    ``checks`` are dropped. Reset it when a new revision is installed. The wait is
    None only when there are no checks.
    """
    for gone in set(state) - {c.name for c in checks}:
        del state[gone]
    waits: list[float] = []
    for check in checks:
        probe = state.setdefault(check.name, ProbeState())
        due = installed_at + check.initial_delay
        if probe.last_probe is not None and probe.last_probe <= now:  # else the clock went back
            due = max(due, probe.last_probe + check.period)
        if now >= due:
            _record(probe, check, evaluate(check, objects), now)
            due = now + check.period
        waits.append(due - now)
    return _combined(checks, state, now=now, installed_at=installed_at), min(waits, default=None)


def _record(probe: ProbeState, check: Check, result: Result, now: float) -> None:
    probe.last_probe, probe.last_failures = now, result.failures
    if result.ok:
        probe.successes, probe.failures = probe.successes + 1, 0
        if probe.successes >= check.success_threshold:
            probe.verdict = True
    else:
        probe.successes, probe.failures = 0, probe.failures + 1
        if probe.failures >= check.failure_threshold:
            probe.verdict = False


def _combined(
    checks: Sequence[Check], state: dict[str, ProbeState], *, now: float, installed_at: float
) -> Health:
    failing: list[str] = []
    undecided: list[str] = []
    for check in checks:
        probe = state[check.name]
        if probe.verdict is False:
            recovering = (
                f"check {check.name}: recovering,"
                f" {probe.successes} of {check.success_threshold} successes"
            )
            failing.extend(probe.last_failures or (recovering,))
        elif probe.verdict is None:
            undecided.extend(_undecided(check, probe, now=now, installed_at=installed_at))
    reasons = failing + undecided
    if not reasons:
        return READY
    more = f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else ""
    return Health(False, _clip(reasons[0], 1024 - len(more.encode())) + more)


def _undecided(check: Check, probe: ProbeState, *, now: float, installed_at: float) -> list[str]:
    if probe.last_probe is None:
        left = installed_at + check.initial_delay - now
        return [f"check {check.name}: waiting {left:.0f}s for the initial delay"]
    if probe.failures:
        return [
            f"{why} (failure {probe.failures} of {check.failure_threshold})"
            for why in probe.last_failures
        ]
    return [f"check {check.name}: {probe.successes} of {check.success_threshold} successes"]


# --- messages ------------------------------------------------------------------------------


def message(health: Health, limit: int = 1024) -> str:
    """``health.reason`` cut to at most ``limit`` UTF-8 bytes, ending in "…" when cut."""
    return _clip(health.reason, limit)


def _clip(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` bytes of valid UTF-8 (stray surrogates become "?")."""
    raw = text.encode(errors="replace")
    if len(raw) <= limit:
        return raw.decode()
    ellipsis = "…".encode()
    return raw[: max(0, limit - len(ellipsis))].decode(errors="ignore") + "…"


def _is_utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _text(value: Any) -> str:
    """A scalar as text: strings as they are, the rest as JSON (``true``, ``3``, ``null``)."""
    return value if isinstance(value, str) else json.dumps(value)


def _show(value: Any) -> str:
    try:
        shown = json.dumps(value, default=repr)
    except (RecursionError, ValueError):
        shown = f"<{_kind(value)}>"
    return _clip(shown, SHOW_CHARS)


def _kind(value: Any) -> str:
    """The JSON kind of ``value``, with an article: "a string", "an object"."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"
