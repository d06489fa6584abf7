"""Entry point of the ``rukpak-provisioner`` console script (``python -m provisioner``).

The edge of the processes that run in the cluster: parses arguments, sets up
key=value logging on stderr once, and hands over to a subcommand module.
Today there is one subcommand, ``instance`` (``provisioner.instance``: the
instance pod's process). The manager (Bundle and BundleDeployment
controllers, see DESIGN.md) is not built yet; without a subcommand this
prints usage naming what exists and exits 2, so nothing mistakes it for a
running controller.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence

from provisioner import instance

EXIT_USAGE = 2


class KeyValueFormatter(logging.Formatter):
    """``ts=... level=... logger=... <message>``; messages are key=value already."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = f"ts={ts}.{int(record.msecs):03d}Z level={record.levelname.lower()} "
        line += f"logger={record.name} {record.getMessage()}"
        if record.exc_info:
            line += " traceback=" + repr(self.formatException(record.exc_info))
        return line


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("urllib3", "requests", "kubernetes"):  # may log URLs and tokens
        logging.getLogger(noisy).setLevel(logging.WARNING)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rukpak-provisioner",
        description="RukPak's in-cluster processes. The manager (Bundle and BundleDeployment "
        "controllers) is not built yet; `instance` is the instance pod's process.",
    )
    parser.add_argument(
        "--log-level", default="INFO", help="DEBUG, INFO, WARNING or ERROR (default: INFO)"
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    instance.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_usage(sys.stderr)
        print(
            "rukpak-provisioner: a subcommand is required: instance"
            " (the manager is not built yet; see --help)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    configure_logging(args.log_level)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
