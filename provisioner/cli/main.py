"""The ``rukpak`` command line: one parser, subcommands contributed by modules.

This is the console script's edge. Each command module exposes
``register(subparsers)``, which adds each subcommand from the function that runs it
(``rukpak.common.command.add``: ``func`` on its parser, a function of the parsed arguments
returning an exit code, whose docstring holds the words of its ``--help``).
These are ``provisioner.cli.bundle`` (``rukpak bundle build|push|inspect``),
``provisioner.cli.apply`` (``rukpak apply|diff|status|uninstall``),
``provisioner.cli.deployments`` (``history|rollback|preview``), ``approve``, ``get`` and
``version``; flags they share are defined once in ``provisioner.runtime.flags``, and
``-o json|yaml|wide|name`` of the read commands in ``provisioner.cli.output``.

Building the parser imports no engine, Kubernetes or registry client: each command imports
what it runs when it runs, so ``rukpak --help`` starts fast (docs/benchmarks.md, CLI).

``kubectl-rukpak`` runs the same command line as a kubectl plugin (``kubectl rukpak
...``), and ``kubectl_complete-rukpak`` completes it for kubectl (``complete``); ``rukpak
completion bash|zsh|fish`` prints argcomplete's completion of ``rukpak`` and
``kubectl-rukpak``.

Exit codes: 0 success; 1 an error with a code (``rukpak.common.errors``) or a local
file error, printed as ``error: <message>`` on stderr; 2 a usage error
(argparse); 130 interrupted.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType

from provisioner.cli import complete, version
from provisioner.runtime import flags
from rukpak.common import command, errors

# Modules that contribute subcommands; a missing optional one is skipped.
COMMAND_MODULES: tuple[tuple[str, bool], ...] = (
    ("provisioner.cli.bundle", True),
    ("provisioner.cli.apply", False),
    ("provisioner.cli.deployments", False),
    ("provisioner.cli.approve", False),
    ("provisioner.cli.get", False),
    ("provisioner.cli.version", True),
)

Handler = Callable[[argparse.Namespace], int]
log = logging.getLogger("rukpak")


def build_parser(prog: str = "rukpak") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Build, push and inspect RukPak bundles; apply them to a cluster.",
    )
    flags.add_verbose(parser)
    version.add_version_flag(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name, required in COMMAND_MODULES:
        module = _load(name, required=required)
        if module is not None:
            module.register(subparsers)
    shells = command.add(subparsers, "completion", run_completion)
    shells.add_argument("shell", choices=complete.SHELLS)
    return parser


def run_completion(args: argparse.Namespace) -> int:
    """print a shell completion script (bash, zsh, fish)

    Print the completion of rukpak and kubectl-rukpak for a shell: source <(rukpak
    completion bash), source <(rukpak completion zsh) (after compinit), rukpak completion
    fish | source. kubectl rukpak completes through kubectl's own completion
    (kubectl_complete-rukpak, kubectl 1.26 and later).
    """
    return _print(complete.script(args.shell))


def _print(text: str) -> int:
    sys.stdout.write(text)
    return 0


def _load(name: str, *, required: bool) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if required or exc.name != name:  # a missing dependency inside it is a real bug
            raise
        return None


def kubectl_main(argv: Sequence[str] | None = None) -> int:
    """``kubectl-rukpak``: the same command line as a kubectl plugin."""
    return main(argv, prog="kubectl rukpak")


def kubectl_complete(argv: Sequence[str] | None = None) -> int:
    """``kubectl_complete-rukpak``: what kubectl runs to complete ``kubectl rukpak ...``."""
    words = list(sys.argv[1:] if argv is None else argv)
    return _print(complete.answer(build_parser("kubectl rukpak"), words))


def main(argv: Sequence[str] | None = None, *, prog: str = "rukpak") -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(prog)
    complete.autocomplete(parser)  # a completion script asking: answers and exits
    args = parser.parse_args(words)
    _configure_logging(verbose=bool(args.verbose))
    handler: Handler = args.func
    try:
        return handler(args)
    except errors.RukpakError as exc:
        log.debug("command failed", exc_info=True)
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `rukpak bundle inspect ... | head`
        _silence_stdout()
        return 0
    except OSError as exc:  # local files: a full disk, an --output path under a file
        log.debug("command failed", exc_info=True)
        where = f": {exc.filename}" if exc.filename else ""
        print(f"error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 1


def _configure_logging(*, verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
        force=True,
    )
    if not verbose:  # urllib3 warnings about retries are noise next to our errors
        logging.getLogger("urllib3").setLevel(logging.ERROR)


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
