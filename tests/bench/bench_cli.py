"""CLI start-up: ``rukpak --help`` (issue 38's ≤ 0.3 s), beside the interpreter's own start.

Where it sits: ``python -m tests.bench cli`` (seconds). Ten runs each of
``python -m provisioner.cli.main --help`` and of ``python -c pass`` (the floor no command
can beat), medians; the test suite checks only what makes start-up cheap (no heavy module
imported to build the parser, ``tests/test_cli_output.py``), this module the time.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tests.bench import Result

ROOT = Path(__file__).resolve().parents[2]
RUNS = 10
BUDGET = 0.3
"""Seconds ``rukpak --help`` may take (docs/benchmarks.md, CLI start-up)."""


def median_seconds(argv: list[str]) -> float:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    timings = []
    for _ in range(RUNS):
        started = time.perf_counter()
        subprocess.run(argv, capture_output=True, env=env, timeout=60, check=True)
        timings.append(time.perf_counter() - started)
    return statistics.median(timings)


def run(workdir: Path) -> list[Result]:
    del workdir
    floor = median_seconds([sys.executable, "-c", "pass"])
    help_ = median_seconds([sys.executable, "-m", "provisioner.cli.main", "--help"])
    return [
        Result(
            "rukpak --help, median of 10",
            help_,
            "s",
            target=BUDGET,
            note=f"python -c pass: {floor:.3f} s (the floor)",
        ),
    ]
