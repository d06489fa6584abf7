"""Entry point of the ``rukpak-provisioner`` console script (``python -m provisioner``).

The edge of the processes that run in the cluster: parses arguments, sets up
key=value logging on stderr once, and hands over to a subcommand module.
Subcommands: ``instance`` (``provisioner.instance.process``: the instance pod's
process), ``standing`` (``provisioner.standing.worker``: the standing provisioner, which
takes instance runs as work), ``volumes`` (``provisioner.storage.cli``: the PV provisioner for
StorageClasses of csi.rukpak.io), ``manager`` (``provisioner.manager.cli``: the Bundle
and BundleDeployment controllers) and ``unpack`` (``provisioner.instance.unpack``: the
unpack pod's process).
Without a subcommand this prints usage and exits 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from rukpak.common.flags import add_log_level
from rukpak.common.logsetup import configure_logging

EXIT_USAGE = 2
SUBCOMMANDS = {
    "instance": "provisioner.instance.process",
    "manager": "provisioner.manager.cli",
    "standing": "provisioner.standing.worker",
    "unpack": "provisioner.instance.unpack",
    "volumes": "provisioner.storage.cli",
}
"""Each subcommand and the module that registers and runs it. Only the module of the
subcommand given is imported (``subcommand_of``): an instance or unpack pod starts
without the manager's and the PV provisioner's imports, about half a second."""


def subcommand_of(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names (its first argument that is not an option or the
    value of ``--log-level``); None when there is none or it is unknown."""
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--log-level":
            skip = True
        elif not arg.startswith("-"):
            return arg if arg in SUBCOMMANDS else None
    return None


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or of subcommand ``only`` alone."""
    parser = argparse.ArgumentParser(
        prog="rukpak-provisioner",
        description="RukPak's in-cluster processes: `manager` (the Bundle and "
        "BundleDeployment controllers), `instance` (the instance pod's process), `standing` "
        "(the standing provisioner: instance runs without a pod each), `unpack` "
        "(the unpack pod's process) and `volumes` (the PV provisioner of csi.rukpak.io "
        "StorageClasses).",
    )
    add_log_level(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module in SUBCOMMANDS.items():
        if only is None or name == only:
            importlib.import_module(module).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(subcommand_of(argv))
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_usage(sys.stderr)
        print(
            "rukpak-provisioner: a subcommand is required: instance, manager, unpack or volumes"
            " (see --help)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    configure_logging(args.log_level)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
