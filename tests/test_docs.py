"""The documentation stays true to the code and navigable: pure, fast checks.

The generated references (``docs/reference/``, written by ``hack/gendocs.py``) must equal
what the generator makes from the code now, so a changed flag or CRD field without
``make docs`` fails here. Every relative link in ``README.md`` and ``docs/`` must lead to
a file that exists, and an anchor to a heading of that file (GitHub's heading ids). The
README stays a short front page that links every page under ``docs/``.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_LINES = 180
"""The front page's bound: what it is, the two commands, a quickstart, links."""

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


@pytest.fixture(scope="module")
def gendocs() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gendocs", ROOT / "hack" / "gendocs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def pages() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def prose_lines(path: Path) -> Iterator[str]:
    """The lines of a Markdown file outside fenced code blocks."""
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced and not line.startswith("    "):
            yield line


def slug(heading: str) -> str:
    """GitHub's id for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    for line in prose_lines(path):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def links(path: Path) -> Iterator[str]:
    """Every link target in ``path``'s prose (code spans and blocks left out)."""
    for line in prose_lines(path):
        for match in LINK.finditer(CODE_SPAN.sub("code", line)):
            yield match.group(1)


def relative_links(path: Path) -> Iterator[tuple[str, Path, str]]:
    """(link as written, file it names, anchor or "") of each link inside the repository."""
    for target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, ...
            continue
        where, _, anchor = target.partition("#")
        file = (path.parent / where).resolve() if where else path
        yield target, file, anchor


# -- the generated references -----------------------------------------------------------------


def test_the_generated_references_match_the_code(gendocs: ModuleType) -> None:
    stale: dict[Path, str] = gendocs.stale(ROOT)
    shown = "\n".join(f"{path}:\n{diff[:3000]}" for path, diff in stale.items())
    assert not stale, (
        f"{', '.join(map(str, stale))} out of date with the code: run `make docs` "
        f"(.venv/bin/python hack/gendocs.py) and commit the result\n{shown}"
    )


def test_the_api_reference_covers_every_served_version_of_every_crd(gendocs: ModuleType) -> None:
    text = (ROOT / gendocs.API_DOC).read_text(encoding="utf-8")
    for crd in gendocs.load_crds():
        kind = crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version.get("served"):
                assert f"### {kind} {version['name']}" in text


def test_the_cli_reference_covers_every_command(gendocs: ModuleType) -> None:
    text = (ROOT / gendocs.CLI_DOC).read_text(encoding="utf-8")
    for needle in (
        "### rukpak bundle build",
        "### rukpak apply",
        "### rukpak rollback",
        "### rukpak-provisioner manager",
        "## rukpak-csi-plugin",
    ):
        assert needle in text


def test_the_cli_reference_does_not_depend_on_the_terminal_or_the_environment(
    gendocs: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = gendocs.render_cli()
    for name, value in {
        "COLUMNS": "40",
        "POD_NAMESPACE": "elsewhere",
        "LOG_LEVEL": "DEBUG",
        "CSI_ENDPOINT": "unix:///other.sock",
    }.items():
        monkeypatch.setenv(name, value)
    assert gendocs.render_cli() == before
    assert os.environ["POD_NAMESPACE"] == "elsewhere"  # the environment is given back


# -- links --------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(path: Path) -> None:
    broken: list[str] = []
    for target, file, anchor in relative_links(path):
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, f"{path.relative_to(ROOT)}: " + "; ".join(broken)


def test_headings_get_github_ids() -> None:
    assert slug("Two API versions on one object: v1alpha1 and v1alpha2") == (
        "two-api-versions-on-one-object-v1alpha1-and-v1alpha2"
    )
    assert slug("On kind: `make kind-run`, `make kind-down`") == (
        "on-kind-make-kind-run-make-kind-down"
    )
    assert slug("`status.contentURL`") == "statuscontenturl"


# -- the front page -----------------------------------------------------------------------------


def test_the_readme_is_a_short_front_page() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move detail into docs/"
    )


def test_the_readme_names_the_test_command() -> None:
    text = README.read_text(encoding="utf-8")
    assert "make test" in text and "make run" in text  # .ci/run calls `make test`


def test_the_readme_links_every_docs_page() -> None:
    linked = {file for _, file, _ in relative_links(README)}
    missing = [
        str(page.relative_to(ROOT)) for page in sorted(DOCS.rglob("*.md")) if page not in linked
    ]
    assert not missing, f"README.md links none of: {', '.join(missing)}"
