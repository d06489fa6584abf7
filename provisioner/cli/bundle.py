"""``rukpak bundle build|push|inspect``: bundle images from the command line (``sign`` and
``verify`` are ``provisioner.cli.signing``'s).

The edge over ``provisioner.bundle.build`` (build into an OCI layout),
``provisioner.bundle.push`` (layout to registry) and
``provisioner.bundle.inspect`` (registry to a description). This module
parses arguments, builds the registry client with credentials and insecure
hosts, reports progress on stderr and prints results; ``provisioner.cli.main``
turns the errors it lets through into exit codes.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from provisioner.cli import output, signing
from provisioner.runtime import flags
from rukpak.common import command, errors

# Building, pushing and the registry client are imported by the commands that run them, not
# to build the parser (start-up).
if TYPE_CHECKING:
    from provisioner.bundle import build as bundle_build
    from provisioner.bundle import inspect as bundle_inspect
    from provisioner.bundle.layout import OciLayout
    from rukpak.oci.manifest import Descriptor
    from rukpak.oci.reference import Reference


def register(subparsers: Any) -> None:
    bundle = subparsers.add_parser(
        "bundle",
        help="build, push and inspect bundle images",
        description="Build plain+v0 bundle images, push them to a registry, look inside them.",
    )
    commands = bundle.add_subparsers(dest="bundle_command", metavar="SUBCOMMAND")
    commands.required = True

    build = command.add(commands, "build", run_build)
    build.add_argument("directory", metavar="DIR", type=Path, help="bundle directory")
    build.add_argument("--tag", "-t", required=True, metavar="REF", help="e.g. host/repo:v1")
    _add_platform_options(build)
    build.add_argument(
        "--output", "-o", type=Path, metavar="LAYOUT_DIR", help="write the OCI layout here"
    )
    build.add_argument("--push", action="store_true", help="push the image to REF after building")
    build.add_argument(
        "--estargz",
        action="store_true",
        help="write an eStargz layer (tar.gz plus a table of contents) so nodes in FUSE "
        "mode can fetch files lazily",
    )
    _add_registry_options(build)

    push = command.add(commands, "push", run_push)
    push.add_argument("arguments", nargs="*", metavar="LAYOUT_DIR|REF", help="[LAYOUT_DIR] [REF]")
    push.add_argument("--from-dir", type=Path, metavar="DIR", help="build this bundle first")
    _add_platform_options(push)
    _add_registry_options(push)

    inspect = command.add(commands, "inspect", run_inspect)
    inspect.add_argument("reference", metavar="REF")
    flags.add_platform(inspect)
    inspect.add_argument("--json", action="store_true", help="print JSON (as -o json)")
    output.add_output(inspect)
    _add_registry_options(inspect, progress=False)
    signing.register(commands)


def _add_platform_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--platform",
        action="append",
        default=[],
        metavar="OS/ARCH[,...]",
        help="platform(s) to build for; repeat or separate with commas (default linux/amd64)",
    )
    parser.add_argument(
        "--platform-dir",
        action="append",
        default=[],
        metavar="OS/ARCH=DIR",
        help="build this platform from its own bundle directory",
    )
    parser.add_argument(
        "--index",
        action="store_true",
        help="make an image index even for a single platform",
    )


def _add_registry_options(parser: argparse.ArgumentParser, *, progress: bool = True) -> None:
    flags.add_registry_command(parser)
    if progress:
        parser.add_argument(
            "--progress", action="store_true", help="show upload progress even when not a TTY"
        )


# -- commands ----------------------------------------------------------------------


def _cli_hints(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Add the CLI's way out to errors the registry client words for the node plugin."""

    @functools.wraps(handler)
    def wrapped(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except (errors.Unauthenticated, errors.PermissionDenied) as exc:
            raise type(exc)(
                f"{exc.message}; rukpak reads credentials from --registry-config FILE "
                "(a docker config.json) or ~/.docker/config.json"
            ) from None

    return wrapped


@_cli_hints
def run_build(args: argparse.Namespace) -> int:
    """build a bundle image from a directory

    Build an OCI image from DIR (which must hold manifests/) into an OCI layout directory,
    and optionally push it. One platform gives an image manifest; several give an index.
    """
    from provisioner.bundle.layout import OciLayout
    from rukpak.oci.reference import Reference

    ref = Reference.parse(args.tag)
    if args.output is None and not args.push:
        raise errors.InvalidArgument(
            "nothing to do: give --output LAYOUT_DIR to keep the image, --push to send it, or both"
        )
    with _layout_dir(args.output) as layout_dir:
        layout = OciLayout.create(layout_dir)
        result = _build(args, args.directory, layout, ref)
        if args.output is not None:
            built = f"{ref}@{result.image.digest} {describe(result)}"
            print(f"built {built} into {layout_dir}", file=sys.stderr)
        if args.push:
            _push(args, layout, result.image, ref)
    return 0


@_cli_hints
def run_push(args: argparse.Namespace) -> int:
    """push a built bundle image

    Push the image of an OCI layout (or build DIR given with --from-dir and push it). REF
    defaults to the reference the layout was built for.
    """
    from provisioner.bundle import push as bundle_push
    from provisioner.bundle.layout import OciLayout
    from rukpak.oci.reference import Reference

    positional: list[str] = list(args.arguments)
    if args.from_dir is not None:
        if len(positional) != 1:
            raise errors.InvalidArgument("usage: rukpak bundle push --from-dir DIR REF")
        ref = Reference.parse(positional[0])
        with _layout_dir(None) as layout_dir:
            layout = OciLayout.create(layout_dir)
            result = _build(args, args.from_dir, layout, ref)
            _push(args, layout, result.image, ref)
        return 0
    if not 1 <= len(positional) <= 2:
        raise errors.InvalidArgument(
            "usage: rukpak bundle push LAYOUT_DIR [REF] or rukpak bundle push --from-dir DIR REF"
        )
    if args.platform or args.platform_dir:
        raise errors.InvalidArgument(
            "--platform and --platform-dir apply to --from-dir; a layout is pushed as it was built"
        )
    layout = OciLayout.open(Path(positional[0]))
    given = Reference.parse(positional[1]) if len(positional) == 2 else None
    image = bundle_push.select_image(layout, given.tag if given else None)
    ref = given or bundle_push.default_reference(layout, image)
    _push(args, layout, image, ref)
    return 0


@_cli_hints
def run_inspect(args: argparse.Namespace) -> int:
    """show what a bundle image in a registry holds

    Print the digest, platforms, layers and files of the image REF names.
    """
    from provisioner.bundle import inspect as bundle_inspect
    from rukpak.oci.manifest import Platform
    from rukpak.oci.reference import Reference

    ref = Reference.parse(args.reference)
    platform = Platform.parse(args.platform) if args.platform else None
    with flags.registry_client(args, ref) as client:
        result = bundle_inspect.inspect(client, ref, platform=platform)
    view = output.View(
        document=bundle_inspect.to_json(result),
        names=[f"{ref.name}@{result.digest}"],
        text=render_inspection(result) + "\n",
    )
    output.emit(view, "json" if args.json else args.output)
    return 0


# -- shared pieces ------------------------------------------------------------------


def _build(
    args: argparse.Namespace, directory: Path, layout: OciLayout, ref: Reference
) -> bundle_build.BuildResult:
    from provisioner.bundle import build as bundle_build

    sources = bundle_build.plan_sources(
        directory,
        bundle_build.parse_platforms(args.platform),
        [bundle_build.parse_platform_dir(v) for v in args.platform_dir],
    )
    result = bundle_build.build(
        layout,
        sources,
        name=str(ref),
        ref_name=ref.tag or "latest",
        force_index=args.index,
        estargz=getattr(args, "estargz", False),
    )
    _report_left_out(result)
    return result


def _report_left_out(result: bundle_build.BuildResult) -> None:
    """Name the hidden entries the image does not carry: nothing is dropped silently."""
    left_out = sorted({p for i in result.images for p in i.layer.extras.left_out})
    if left_out:
        print(f"left out hidden entries: {', '.join(left_out)}", file=sys.stderr)


def describe(result: bundle_build.BuildResult) -> str:
    """``(index of 2 platforms: linux/amd64, linux/arm64/v8; 3 files)``."""
    platforms = ", ".join(str(i.platform) for i in result.images)
    files = {f.path for i in result.images for f in i.layer.files}
    files |= {e.path for i in result.images for e in i.layer.extras.files}
    kind = f"index of {len(result.images)} platforms" if result.is_index else "image"
    return f"({kind}: {platforms}; {len(files)} files)"


def _push(args: argparse.Namespace, layout: OciLayout, image: Descriptor, ref: Reference) -> None:
    from provisioner.bundle import push as bundle_push

    show = bool(args.progress) or sys.stderr.isatty()
    progress = _Progress(sys.stderr) if show else None
    try:
        with flags.registry_client(args, ref) as client:
            result = bundle_push.push_image(
                client, layout, image, ref, progress=progress.update if progress else None
            )
    finally:
        if progress is not None:
            progress.finish()
    counts = result.counts
    extra = f"; {counts.blobs_present} already present" if counts.blobs_present else ""
    print(
        f"pushed {result.reference} ({counts.blobs_uploaded} blobs, "
        f"{human_size(counts.bytes_uploaded)}{extra})",
        file=sys.stderr,
    )


@contextlib.contextmanager
def _layout_dir(output: Path | None) -> Iterator[Path]:
    """The given output directory, or a temp dir removed afterwards."""
    if output is not None:
        yield output
        return
    with tempfile.TemporaryDirectory(prefix="rukpak-bundle-") as temp:
        yield Path(temp) / "layout"


def render_inspection(result: bundle_inspect.Inspection) -> str:
    lines = [
        f"Reference:  {result.reference}",
        f"Digest:     {result.digest}",
        f"Media type: {result.media_type}",
    ]
    if result.platforms:
        offered = ", ".join(str(p) for p in result.platforms)
        lines.append(f"Platforms:  {offered}")
        lines.append(f"Showing:    {result.platform} ({result.manifest.digest})")
    bundle_format = result.annotations.get("io.rukpak.bundle.format")
    if bundle_format:
        lines.append(f"Format:     {bundle_format}")
    lines.append("Layers:")
    for layer in result.layers:
        d = layer.descriptor
        lines.append(f"  {d.digest}  {human_size(d.size):>10}  {d.media_type}")
    lines.append("Files:")
    files = [f for f in result.files if f.type != "dir"]
    width = max((len(human_size(f.size)) for f in files), default=0)
    for f in files:
        suffix = "" if f.type == "file" else f"  ({f.type})"
        lines.append(f"  {human_size(f.size):>{width}}  {f.path}{suffix}")
    if not files:
        lines.append("  (none)")
    return "\n".join(lines)


def human_size(size: int) -> str:
    """1536 -> '1.5 KiB'."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


class _Progress:
    """One line per blob on stderr: digest, bytes sent / total, percent."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.current: str | None = None
        self.last_percent = -1

    def update(self, digest: str, sent: int, total: int) -> None:
        short = digest.removeprefix("sha256:")[:12]
        percent = 100 if total <= 0 else min(100, sent * 100 // total)
        if digest != self.current:
            self.finish()
            self.current, self.last_percent = digest, -1
        step = 1 if self.tty else 10  # a log gets a line per 10%
        if percent // step == self.last_percent // step and self.last_percent >= 0:
            return
        self.last_percent = percent
        line = f"  {short}  {human_size(sent):>10} / {human_size(total):<10} {percent:3d}%"
        if self.tty:
            self.stream.write("\r" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def finish(self) -> None:
        if self.current is not None and self.tty:
            self.stream.write("\n")
            self.stream.flush()
        self.current = None
