"""Benchmarks: real components, each figure compared with a baseline measured in the same run.

Where it sits: beside the tests, run by ``make bench`` as ``python -m tests.bench
[names...]`` (see ``tests.bench.__main__``), never by pytest. Absolute timings on
a shared 2-core machine mean little, so a figure is either a ratio against a
baseline taken on the same disk in the same run (``curl | tar -xz`` for the
CSI plugin, ``kubectl apply --server-side`` for the apply engine) or an
absolute budget that holds with a wide margin (p99 latency, RSS, pull counts).

A benchmark module is ``tests/bench/bench_<name>.py`` and exposes::

    def run(workdir: pathlib.Path) -> list[tests.bench.Result]: ...

``workdir`` is an empty temp directory the runner removes afterwards; the
module starts whatever it needs (registry, plugin, cluster) inside it and stops
it, by pid, before returning. It may print progress to stderr. The runner
prints one table of all results and writes them to ``tests/bench/results.json``;
it exits 1 when any result misses its target. Modules: ``bench_csi`` (the node
plugin's pull, unpack and publish path) and ``bench_apply`` (the apply engine).
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

Verdict = Literal["pass", "FAIL", "info"]


@dataclass(frozen=True)
class Result:
    """One figure.

    ``measured`` and ``baseline`` share ``unit``. When ``target`` is set the
    verdict compares it with the ratio ``measured / baseline`` if there is a
    baseline, else with ``measured`` itself; ``at_most`` (the default) means
    smaller is better and the target is an upper bound.
    """

    name: str
    measured: float
    unit: str
    baseline: float | None = None
    target: float | None = None
    at_most: bool = True
    note: str = ""

    @property
    def ratio(self) -> float | None:
        if self.baseline is None:
            return None
        return self.measured / self.baseline if self.baseline else math.inf

    @property
    def compared(self) -> float:
        ratio = self.ratio
        return self.measured if ratio is None else ratio

    @property
    def verdict(self) -> Verdict:
        if self.target is None:
            return "info"
        ok = self.compared <= self.target if self.at_most else self.compared >= self.target
        return "pass" if ok else "FAIL"

    def target_text(self) -> str:
        if self.target is None:
            return "-"
        sign = "<=" if self.at_most else ">="
        suffix = "x" if self.baseline is not None else f" {self.unit}"
        return f"{sign} {_num(self.target)}{suffix}"

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data.update(ratio=self.ratio, verdict=self.verdict, target_text=self.target_text())
        return data


def percentile(samples: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile (``pct`` in 0..100) of a non-empty sample."""
    ordered = sorted(samples)
    rank = max(1, math.ceil(pct / 100 * len(ordered)))
    return ordered[rank - 1]


def median(samples: Sequence[float]) -> float:
    return float(statistics.median(samples))


def timed(
    name: str, samples: Sequence[float], *, target: float | None = None, warmed: bool = False
) -> Result:
    """The median of ``samples`` (seconds) as a Result whose note lists them."""
    after = " after a warm-up" if warmed else ""
    return Result(
        name=name,
        measured=median(samples),
        unit="s",
        target=target,
        note=f"median of {len(samples)}{after}; samples {[round(x, 2) for x in samples]}",
    )


def against(
    name: str,
    samples: Sequence[float],
    baseline: Sequence[float],
    *,
    note: str,
    target: float | None = None,
) -> Result:
    """The median of ``samples`` against the median of ``baseline`` (seconds, the same run)."""
    return Result(
        name=name,
        measured=median(samples),
        baseline=median(baseline),
        unit="s",
        target=target,
        note=note,
    )


def progress(message: str) -> None:
    """A progress line on stderr (the table goes to stdout)."""
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def _num(value: float) -> str:
    if value == 0 or math.isinf(value):
        return str(value)
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}" if abs(value) < 1 else f"{value:.2f}"


def table(results: Sequence[Result]) -> str:
    """The results as a fixed-width text table."""
    header = ("benchmark", "measured", "baseline", "ratio", "target", "verdict")
    rows = [header]
    for r in results:
        rows.append(
            (
                r.name,
                f"{_num(r.measured)} {r.unit}",
                "-" if r.baseline is None else f"{_num(r.baseline)} {r.unit}",
                "-" if r.ratio is None else f"{r.ratio:.2f}x",
                r.target_text(),
                r.verdict,
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    notes = [f"  {r.name}: {r.note}" for r in results if r.note]
    if notes:
        lines += ["", "notes:", *notes]
    return "\n".join(lines)
