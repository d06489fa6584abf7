"""Shell completion of the ``rukpak`` command line, read off its argparse parser.

Where it sits: beside ``main`` (which builds the parser). Two front ends use it:

- ``rukpak completion bash|zsh|fish``: the script of ``argcomplete`` (a well-kept library
  that completes argparse parsers) for ``rukpak`` and ``kubectl-rukpak``. The shell runs
  the command with ``_ARGCOMPLETE`` set; ``main`` then hands the parser to
  ``argcomplete.autocomplete`` (:func:`autocomplete`), which answers and exits before
  anything else runs. Subcommands, flags and choices (``-o json``) complete; positional
  arguments and flag values fall back to file names, since most of them are paths.
- ``kubectl_complete-rukpak`` (a console script): kubectl 1.26 and later completes a
  plugin's arguments by running ``kubectl_complete-<plugin> ARGS...`` and reading
  Cobra's ``__complete`` answer: one candidate a line, then ``:<directive>``
  (:func:`answer`). So ``kubectl rukpak <TAB>`` completes wherever kubectl's own
  completion is set up.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

SHELLS = ("bash", "zsh", "fish")
EXECUTABLES = ("rukpak", "kubectl-rukpak")
DIRECTIVE_DEFAULT = 0
"""Cobra: let the shell complete file names too."""
DIRECTIVE_NO_FILES = 4
"""Cobra: only the candidates given."""


def script(shell: str) -> str:
    """The completion script of ``shell`` (one of ``SHELLS``) for ``EXECUTABLES``."""
    if shell not in SHELLS:
        raise ValueError(f"no completion for shell {shell!r}; use one of {', '.join(SHELLS)}")
    from argcomplete.shell_integration import shellcode

    text: str = shellcode(list(EXECUTABLES), shell=shell)
    return text


def autocomplete(parser: argparse.ArgumentParser) -> None:
    """When a completion script runs us (``_ARGCOMPLETE`` set): answer and exit. Otherwise
    nothing, and argcomplete is not even imported (start-up)."""
    if "_ARGCOMPLETE" not in os.environ:
        return
    import argcomplete

    argcomplete.autocomplete(parser)


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _takes_value(parser: argparse.ArgumentParser, option: str) -> bool:
    action = parser._option_string_actions.get(option)
    return action is not None and action.nargs != 0


def candidates(parser: argparse.ArgumentParser, words: Sequence[str]) -> tuple[list[str], int]:
    """Completions of the last of ``words`` (the ones before it are typed already), and the
    Cobra directive that goes with them."""
    *done, current = list(words) or [""]
    skip = False
    for word in done:
        if skip:
            skip = False
            continue
        if word.startswith("-"):
            skip = "=" not in word and _takes_value(parser, word)
            continue
        parser = _subcommands(parser).get(word, parser)
    if skip:  # the value of a flag: a path, most of the time
        return [], DIRECTIVE_DEFAULT
    if current.startswith("-"):
        options = sorted(o for o in parser._option_string_actions if o.startswith(current))
        return options, DIRECTIVE_NO_FILES
    subcommands = _subcommands(parser)
    if subcommands:
        return sorted(n for n in subcommands if n.startswith(current)), DIRECTIVE_NO_FILES
    return [], DIRECTIVE_DEFAULT


def answer(parser: argparse.ArgumentParser, words: Sequence[str]) -> str:
    """Cobra's ``__complete`` answer for ``words``."""
    found, directive = candidates(parser, words)
    return "".join(f"{c}\n" for c in found) + f":{directive}\n"
