"""``python -m csi.mirror``: the registry mirror process (``csi.mirror.server``).

Flags, logging, SIGTERM; the mirror's behaviour is documented in ``csi.mirror.server``.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from csi.mirror.server import Mirror, serve
from rukpak.oci import client as oci_client

log = logging.getLogger("rukpak.mirror")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m csi.mirror",
        description="Serve registries' content by digest to the node plugins, fetching each "
        "digest once (node plugins name it with --registry-mirror REGISTRY=MIRROR).",
    )
    p.add_argument("--listen", default="0.0.0.0:5000", help="HOST:PORT to serve on")
    p.add_argument("--root", type=Path, required=True, help="directory of the content store")
    p.add_argument(
        "--upstream",
        action="append",
        required=True,
        metavar="HOST[:PORT]",
        help="a registry this mirror fetches from (repeatable); requests naming others get 403",
    )
    p.add_argument(
        "--insecure-registry",
        action="append",
        default=[],
        metavar="HOST[:PORT]",
        help="an upstream spoken to over plain HTTP (loopback ones always are)",
    )
    p.add_argument(
        "--max-bytes",
        type=int,
        default=20 * 1024**3,
        help="the store's budget: the least recently served blobs go beyond it",
    )
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning"))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), stream=sys.stderr, format="%(levelname)s %(name)s %(message)s"
    )
    host, _, port = args.listen.rpartition(":")
    insecure = tuple(args.insecure_registry)
    mirror = Mirror(
        args.root,
        upstreams=args.upstream,
        client=lambda: oci_client.RegistryClient(insecure=insecure),
        max_bytes=args.max_bytes,
    )
    server = serve(mirror, (host or "0.0.0.0", int(port)))
    stopped = threading.Event()

    def stop(signum: int, _frame: object) -> None:
        log.info("msg='stopping' signal=%s", signal.Signals(signum).name)
        stopped.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    bound = f"{host or '0.0.0.0'}:{server.server_port}"
    log.info("msg='serving' address=%s upstreams=%s", bound, sorted(args.upstream))
    print(bound, flush=True)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        mirror.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
