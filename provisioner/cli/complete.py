"""Shell completion of the ``rukpak`` command line, read off its argparse parser.

Where it sits: beside ``main`` (which builds the parser). Two front ends use it:

- ``kubectl_complete-rukpak`` (a console script): kubectl 1.26 and later completes a
  plugin's arguments by running ``kubectl_complete-<plugin> ARGS...`` and reading
  Cobra's ``__complete`` answer: one candidate a line, then ``:<directive>``. So
  ``kubectl rukpak <TAB>`` completes wherever kubectl's own completion is set up.
- ``rukpak completion bash``: a bash function for ``rukpak`` and ``kubectl-rukpak``
  that asks the same code (``rukpak __complete ARGS...``).

Subcommands and flags are completed; a flag's value and positional arguments fall back
to file names (Cobra's default directive), since most of them are paths.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

DIRECTIVE_DEFAULT = 0
"""Cobra: let the shell complete file names too."""
DIRECTIVE_NO_FILES = 4
"""Cobra: only the candidates given."""

BASH_SCRIPT = """\
# rukpak and kubectl-rukpak completion for bash: source <(rukpak completion bash)
_rukpak_complete() {
    local IFS=$'\\n' line directive=0 out
    out=$(rukpak __complete "${COMP_WORDS[@]:1:$COMP_CWORD}" 2>/dev/null) || return
    COMPREPLY=()
    while read -r line; do
        case "$line" in
            :*) directive=${line#:} ;;
            *) COMPREPLY+=("$line") ;;
        esac
    done <<< "$out"
    if [ "${#COMPREPLY[@]}" -eq 0 ] && [ $((directive & 4)) -eq 0 ]; then
        COMPREPLY=($(compgen -f -- "${COMP_WORDS[COMP_CWORD]}"))
    fi
}
complete -o default -F _rukpak_complete rukpak kubectl-rukpak
"""


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
