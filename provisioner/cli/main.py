"""The ``rukpak`` command line: one parser, subcommands contributed by modules.

This is the console script's edge. Each command module exposes
``register(subparsers)``, which adds its subcommands and sets ``func`` on
their parsers (a function of the parsed arguments returning an exit code).
These are ``provisioner.cli.bundle`` (``rukpak bundle build|push|inspect``) and
``provisioner.cli.apply`` (``rukpak apply|diff|status|uninstall``); flags they
share are defined once in ``provisioner.runtime.flags``.

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

from provisioner.runtime import flags
from rukpak.common import errors

# Modules that contribute subcommands; a missing optional one is skipped.
COMMAND_MODULES: tuple[tuple[str, bool], ...] = (
    ("provisioner.cli.bundle", True),
    ("provisioner.cli.apply", False),
)

Handler = Callable[[argparse.Namespace], int]
log = logging.getLogger("rukpak")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rukpak",
        description="Build, push and inspect RukPak bundles; apply them to a cluster.",
    )
    flags.add_verbose(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name, required in COMMAND_MODULES:
        module = _load(name, required=required)
        if module is not None:
            module.register(subparsers)
    return parser


def _load(name: str, *, required: bool) -> ModuleType | None:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if required or exc.name != name:  # a missing dependency inside it is a real bug
            raise
        return None


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
