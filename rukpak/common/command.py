"""Subcommands registered from the functions that run them, and configs from parsed flags.

Where it sits: in the shared corner, under the project's two command lines: ``rukpak``
(``provisioner.cli``) and the ``rukpak-provisioner`` processes (``provisioner.__main__``).
Standard library only. (The release tools under ``hack/`` keep their own argparse: they
also run on the previous release's tree, which lacks this module.)

``add(subparsers, "apply", run_apply)`` adds the subcommand ``apply`` that
``run_apply`` carries out (``func`` on the parsed arguments), click-style: the words of
its ``--help`` are the docstring of ``run_apply``, so they live with the code they
describe. The docstring's first paragraph is the help line the parent lists; the
paragraphs after it are the description, up to the first that opens with a heading of
``EPILOG_HEADINGS`` (``examples:``, ``exit status:``), which starts the epilog. A prose
paragraph's lines are joined into one line, as argparse would fill it; a paragraph whose
later lines are indented (examples) is kept line by line, and then the whole help is
shown as written (``argparse.RawDescriptionHelpFormatter``). A function without a
docstring is refused when the command is registered, that is when the parser is built.

``config_from(Settings, args, service_account=args.instance_service_account)`` builds a
dataclass from parsed arguments: each field from the flag of the same name, the others
given by the caller (a flag of another name, a value worked out from flags).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

Run = Callable[[argparse.Namespace], Any]
"""What carries out a command: the parsed arguments in, an exit status (or None) out."""
D = TypeVar("D", bound="DataclassInstance")

EPILOG_HEADINGS = ("examples:", "exit status:")
"""Paragraphs of a command's docstring from the first that opens with one of these on are
its epilog (shown after the options)."""
_BLANK_LINE = re.compile(r"\n[ \t]*\n")


class Words(NamedTuple):
    """What a command's ``--help`` says, from its run function's docstring."""

    help: str
    description: str | None
    epilog: str | None
    as_written: bool
    """Some paragraph keeps its line breaks: show description and epilog as written."""


def words_of(run: Run) -> Words:
    """The help, description and epilog in ``run``'s docstring (see the module's).
    ValueError when it has none, or it opens with an epilog heading instead of a help line."""
    name = getattr(run, "__qualname__", repr(run))
    doc = inspect.cleandoc(run.__doc__ or "")
    if not doc:
        raise ValueError(
            f"{name} has no docstring: its first line is the help of the command it runs "
            "(docstrings are stripped under python -OO)"
        )
    paragraphs = [_paragraph(text) for text in _BLANK_LINE.split(doc)]
    first, rest = paragraphs[0], paragraphs[1:]
    if first[0].startswith(EPILOG_HEADINGS) or first[1]:
        raise ValueError(f"{name}'s docstring must open with the command's help line")
    cut = next((i for i, (text, _) in enumerate(rest) if text.startswith(EPILOG_HEADINGS)), None)
    cut = len(rest) if cut is None else cut
    return Words(
        help=first[0],
        description="\n\n".join(text for text, _ in rest[:cut]) or None,
        epilog="\n\n".join(text for text, _ in rest[cut:]) or None,
        as_written=any(literal for _, literal in rest),
    )


def _paragraph(text: str) -> tuple[str, bool]:
    """A paragraph of a cleaned docstring, and whether it is kept line by line (its later
    lines are indented) rather than prose joined into one line."""
    lines = text.splitlines()
    if any(line[:1].isspace() for line in lines[1:]):
        return text, True
    return " ".join(line.strip() for line in lines), False


def add(subparsers: Subparsers, name: str, run: Run) -> argparse.ArgumentParser:
    """Add the subcommand ``name``, carried out by ``run`` and described by its docstring
    (``words_of``); the caller adds its arguments to the parser returned."""
    words = words_of(run)
    parser = subparsers.add_parser(
        name,
        help=words.help,
        description=words.description,
        epilog=words.epilog,
        formatter_class=(
            argparse.RawDescriptionHelpFormatter if words.as_written else argparse.HelpFormatter
        ),
    )
    parser.set_defaults(func=run)
    return parser


def config_from(cls: type[D], args: argparse.Namespace, /, **given: Any) -> D:
    """A ``cls`` (a dataclass) made from parsed ``args``: every field that ``given`` does not
    name from the argument of the same name, where the parser has one; fields that neither
    names keep their defaults. ``given`` holds the rest: a flag of another name
    (``bundle_format=args.format``), a value worked out from flags."""
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"{cls!r} is not a dataclass")
    fields = (f.name for f in dataclasses.fields(cls) if f.init and f.name not in given)
    found = {name: getattr(args, name) for name in fields if hasattr(args, name)}
    return cls(**found, **given)
