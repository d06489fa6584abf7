"""The ``rukpak`` command line: one parser, subcommands contributed by modules.

This is the console script's edge. Each command module exposes
``register(subparsers)``, which adds its subcommands and sets ``func`` on
their parsers (a function of the parsed arguments returning an exit code).
These are ``provisioner.cli.bundle`` (``rukpak bundle build|push|inspect``) and
``provisioner.cli.apply`` (``rukpak apply|diff|status|uninstall``); flags they
share are defined once in ``provisioner.runtime.flags``.

``kubectl-rukpak`` runs the same command line as a kubectl plugin (``kubectl rukpak
...``), and ``kubectl_complete-rukpak`` completes it for kubectl (``complete``); ``rukpak
completion bash`` prints a bash completion of ``rukpak`` and ``kubectl-rukpak``.

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

from provisioner.cli import complete
from provisioner.runtime import flags
from rukpak.common import errors

# Modules that contribute subcommands; a missing optional one is skipped.
COMMAND_MODULES: tuple[tuple[str, bool], ...] = (
    ("provisioner.cli.bundle", True),
    ("provisioner.cli.apply", False),
    ("provisioner.cli.deployments", False),
)

Handler = Callable[[argparse.Namespace], int]
log = logging.getLogger("rukpak")


def build_parser(prog: str = "rukpak") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Build, push and inspect RukPak bundles; apply them to a cluster.",
    )
    flags.add_verbose(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name, required in COMMAND_MODULES:
        module = _load(name, required=required)
        if module is not None:
            module.register(subparsers)
    shells = subparsers.add_parser(
        "completion",
        help="print a shell completion script",
        description="Print a bash completion of rukpak and kubectl-rukpak: "
        "source <(rukpak completion bash). kubectl rukpak completes through kubectl's own "
        "completion (kubectl_complete-rukpak, kubectl 1.26 and later).",
    )
    shells.add_argument("shell", choices=["bash"])
    shells.set_defaults(func=lambda _args: _print(complete.BASH_SCRIPT))
    return parser


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
    if words[:1] == ["__complete"]:  # the bash completion's question (Cobra's protocol)
        return _print(complete.answer(build_parser(prog), words[1:]))
    parser = build_parser(prog)
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
