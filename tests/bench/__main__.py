"""Run benchmark modules and report: ``python -m tests.bench [names...]``.

Where it sits: the entry point of ``make bench``. ``names`` select modules
``tests/bench/bench_<name>.py`` (all of them when none are given); each runs
in its own temp directory (``--keep`` keeps them for inspection). Prints one
table and updates ``tests/bench/results.json`` (``--output`` to change it):
the modules run replace their entry, the others keep their last results.
Exits 1 when a result misses its target, 2 when a module crashed.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

from tests.bench import Result, progress, table

HERE = Path(__file__).parent
PREFIX = "bench_"


def available() -> list[str]:
    return sorted(p.stem[len(PREFIX) :] for p in HERE.glob(f"{PREFIX}*.py"))


def write_report(path: Path, modules: dict[str, dict[str, object]]) -> None:
    """Update ``path`` with this run's modules; modules not run keep their last results."""
    try:
        previous = json.loads(path.read_text()).get("modules", {})
    except (OSError, ValueError, AttributeError):
        previous = {}
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    host = {"cpus": os.cpu_count(), "python": platform.python_version()}
    for module in modules.values():
        module.update(created=stamp, host=host)
    report = {"modules": {**previous, **modules}}
    path.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench", description=__doc__)
    parser.add_argument("names", nargs="*", help=f"modules to run (default all: {available()})")
    parser.add_argument("--output", type=Path, default=HERE / "results.json", help="JSON file")
    parser.add_argument("--keep", action="store_true", help="keep the temp work directories")
    args = parser.parse_args(argv)
    names = args.names or available()
    unknown = sorted(set(names) - set(available()))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; available: {available()}")

    results: list[Result] = []
    crashed: list[str] = []
    modules: dict[str, dict[str, object]] = {}
    for name in names:
        module = importlib.import_module(f"tests.bench.{PREFIX}{name}")
        workdir = Path(tempfile.mkdtemp(prefix=f"rukpak-bench-{name}-"))
        progress(f"{name}: running in {workdir}")
        started = time.monotonic()
        try:
            got: list[Result] = module.run(workdir)
        except Exception:
            traceback.print_exc()
            crashed.append(name)
            got = []
        finally:
            if not args.keep:
                shutil.rmtree(workdir, ignore_errors=True)
        seconds = time.monotonic() - started
        modules[name] = {
            "seconds": round(seconds, 1),
            "crashed": name in crashed,
            "results": [r.to_json() for r in got],
        }
        progress(f"{name}: done in {seconds:.0f}s")
        results.extend(got)

    print(table(results))
    write_report(args.output, modules)
    if crashed:
        print(f"\ncrashed: {', '.join(crashed)}", file=sys.stderr)
        return 2
    return 1 if any(r.verdict == "FAIL" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
