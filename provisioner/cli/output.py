"""``-o json|yaml|wide|name``: how every read command of ``rukpak`` prints its answer.

Where it sits: beside the command modules (``apply``'s ``status``, ``deployments``'
``history``, ``preview`` and ``get``, ``bundle inspect``, ``version``). A command builds
one :class:`View` of its answer (a table, the names of what it shows, a document) and
hands it to :func:`emit`; the flag is added by :func:`add_output`. So the presentations
mean the same in every command, as kubectl's do:

- table (the default): columns padded to the widest cell, headers in capitals;
- ``wide``: the table with the view's extra columns;
- ``name``: ``<resource>/<name>`` one a line (``bundledeployment.core.rukpak.io/app``);
- ``json`` / ``yaml``: the view's document, as the API would give it (a ``List`` with
  ``items`` when the command shows several objects).

Pure: it only formats text; the caller writes it (``emit`` writes to stdout).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

FORMATS = ("json", "yaml", "wide", "name")
"""The values of ``-o``; without it, the table."""
TABLE = "table"


def add_output(parser: argparse.ArgumentParser, *, formats: Sequence[str] = FORMATS) -> None:
    """``-o/--output FORMAT`` of a read command (``formats``: those that make sense for it;
    ``version`` has no table to widen nor objects to name)."""
    words = {"json": "json", "yaml": "yaml", "wide": "wide (more columns)", "name": "name"}
    said = [words[f] for f in formats]
    parser.add_argument(
        "-o",
        "--output",
        choices=formats,
        default=TABLE,
        metavar="FORMAT",
        help=f"{', '.join(said[:-1])} or {said[-1]}; default: text"
        if len(said) > 1
        else f"{said[0]}; default: text",
    )


@dataclass(frozen=True)
class View:
    """One command's answer in every presentation.

    ``rows`` hold the cells of ``columns``; ``wide`` the cells of ``wide_columns`` per row
    (same order), shown after them by ``-o wide``. ``heading`` is a line above the table
    (``history`` names its BundleDeployment there); ``text`` replaces the table when the
    answer is prose (``preview``'s rendering). ``names`` are what ``-o name`` prints and
    ``document`` what ``-o json|yaml`` print."""

    document: Any
    names: Sequence[str]
    columns: Sequence[str] = ()
    rows: Sequence[Sequence[str]] = ()
    wide_columns: Sequence[str] = ()
    wide: Sequence[Sequence[str]] = ()
    heading: str = ""
    text: str | None = None
    empty: str = field(default="")
    """Said on stderr (not stdout) when a table has no rows: ``No resources found``."""


def table(columns: Sequence[str], rows: Sequence[Sequence[str]], *, gap: int = 2) -> str:
    """``columns`` and ``rows`` as aligned text, the last column not padded."""
    lines = [list(columns), *[list(r) for r in rows]]
    if not columns:
        return ""
    widths = [max(len(line[i]) for line in lines) for i in range(len(columns) - 1)]
    out = []
    for line in lines:
        cells = [cell.ljust(width + gap) for cell, width in zip(line, widths, strict=False)]
        out.append(("".join(cells) + line[-1]).rstrip())
    return "\n".join(out) + "\n"


def render(view: View, fmt: str) -> str:
    """``view`` as ``fmt`` (one of ``FORMATS`` or ``TABLE``) shows it."""
    if fmt == "json":
        return json.dumps(view.document, indent=2, sort_keys=False) + "\n"
    if fmt == "yaml":
        import yaml  # a few ms; only the commands asked for YAML pay them

        text: str = yaml.safe_dump(view.document, sort_keys=False)
        return text
    if fmt == "name":
        return "".join(f"{n}\n" for n in view.names)
    if fmt not in (TABLE, "wide"):
        raise ValueError(f"unknown output format {fmt!r}; use one of {', '.join(FORMATS)}")
    if view.text is not None and (fmt == TABLE or not view.wide_columns):
        return view.text
    if not view.rows:
        return ""
    columns, rows = list(view.columns), [list(r) for r in view.rows]
    if fmt == "wide" and view.wide_columns:
        columns += view.wide_columns
        rows = [[*r, *extra] for r, extra in zip(rows, view.wide, strict=True)]
    heading = f"{view.heading}\n" if view.heading else ""
    return heading + table(columns, rows)


def emit(view: View, fmt: str) -> None:
    """Print ``view`` as ``fmt`` on stdout (and ``view.empty`` on stderr for an empty table)."""
    sys.stdout.write(render(view, fmt))
    if fmt in (TABLE, "wide") and view.text is None and not view.rows and view.empty:
        print(view.empty, file=sys.stderr)


def kube_list(items: Sequence[Any]) -> dict[str, Any]:
    """Several API objects as ``-o json|yaml`` shows them: a ``v1`` ``List``."""
    return {"apiVersion": "v1", "kind": "List", "items": list(items), "metadata": {}}
