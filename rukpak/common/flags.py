"""Command-line flags that processes on both halves share, defined once.

Where it sits: beside ``logsetup`` in the shared corner. The node plugin
(``csi.plugin.main``) and every ``rukpak-provisioner`` process (``provisioner.__main__``)
take ``--log-level`` for ``logsetup.configure_logging``; the plugin and the PV
provisioner (``provisioner.storage.cli``) name the CSI driver with ``--driver-name``.
Both fall back to environment variables so a Deployment or DaemonSet can set either.
The provisioner's own shared flags are ``provisioner.runtime.flags``.
"""

from __future__ import annotations

import argparse
import os

DRIVER_NAME = "csi.rukpak.io"


def add_log_level(parser: argparse.ArgumentParser) -> None:
    """``--log-level`` (env ``LOG_LEVEL``, default INFO)."""
    parser.add_argument(
        "--log-level",
        default=os.environ.get("LOG_LEVEL", "INFO"),
        help="DEBUG, INFO, WARNING or ERROR (env LOG_LEVEL; default: %(default)s)",
    )


def add_driver_name(parser: argparse.ArgumentParser, *, role: str) -> None:
    """``--driver-name`` (env ``DRIVER_NAME``); ``role`` says what the name must match."""
    parser.add_argument(
        "--driver-name",
        default=os.environ.get("DRIVER_NAME", DRIVER_NAME),
        help=f"CSI driver name; {role} (env DRIVER_NAME; default: %(default)s)",
    )
