"""Entry point of the ``rukpak-provisioner`` console script (``python -m provisioner``).

The edge of the processes that run in the cluster: parses arguments, sets up
key=value logging on stderr once, and hands over to a subcommand module.
Subcommands: ``instance`` (``provisioner.instance.process``: the instance pod's
process), ``volumes`` (``provisioner.storage.cli``: the PV provisioner for
StorageClasses of csi.rukpak.io) and ``manager`` (``provisioner.manager.cli``: the
BundleDeployment controller; the Bundle unpack controller of DESIGN.md is not built yet).
Without a subcommand this prints usage and exits 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from provisioner.instance import process as instance
from provisioner.manager import cli as manager_cli
from provisioner.manager import unpack
from provisioner.storage import cli as volumes_cli
from rukpak.common.flags import add_log_level
from rukpak.common.logsetup import configure_logging

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rukpak-provisioner",
        description="RukPak's in-cluster processes: `manager` (the Bundle and "
        "BundleDeployment controllers), `instance` (the instance pod's process), `unpack` "
        "(the unpack pod's process) and `volumes` (the PV provisioner of csi.rukpak.io "
        "StorageClasses).",
    )
    add_log_level(parser)
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    instance.register(subparsers)
    manager_cli.register(subparsers)
    unpack.register(subparsers)
    volumes_cli.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
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
