"""Structured logging for our processes: one key=value line per record on stderr.

Where it sits: configured once in each ``__main__`` (the node plugin, the
provisioner's instance and manager). Messages are key=value already; the
formatter adds the time, level and logger. Libraries that may log URLs with
tokens in them are kept below WARNING.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable

QUIET_LIBRARIES = ("urllib3", "requests", "oras", "kubernetes")


class KeyValueFormatter(logging.Formatter):
    """``ts=... level=... logger=... <message>``; messages are key=value already."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = f"ts={ts}.{int(record.msecs):03d}Z level={record.levelname.lower()} "
        line += f"logger={record.name} {record.getMessage()}"
        if record.exc_info:
            line += " traceback=" + repr(self.formatException(record.exc_info))
        return line


def configure_logging(level: str, *, quiet: Iterable[str] = QUIET_LIBRARIES) -> None:
    """Send every record at ``level`` or above to stderr as one key=value line."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in quiet:
        logging.getLogger(noisy).setLevel(logging.WARNING)
