"""Entry point of the ``rukpak-provisioner`` console script (``python -m provisioner``).

The edge of the processes that run in the cluster: parses arguments, sets up
key=value logging on stderr once, and hands over to a subcommand module.
Subcommands: ``instance`` (``provisioner.instance.process``: the instance pod's
process) and ``manager`` (``provisioner.manager.cli``: the BundleDeployment
controller; the Bundle unpack controller of DESIGN.md is not built yet).
Without a subcommand this prints usage and exits 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from csi.common.logsetup import configure_logging
from provisioner.instance import process as instance
from provisioner.manager import cli as manager_cli

EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rukpak-provisioner",
        description="RukPak's in-cluster processes: `manager` (the BundleDeployment "
        "controller) and `instance` (the instance pod's process).",
    )
    parser.add_argument(
        "--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR (default: INFO)"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    instance.register(subparsers)
    manager_cli.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_usage(sys.stderr)
        print(
            "rukpak-provisioner: a subcommand is required: instance or manager"
            " (the Bundle unpack half of the manager is not built yet; see --help)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    configure_logging(args.log_level)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
