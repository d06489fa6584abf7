"""The flags every command shares (``provisioner.cli.flags``) mean the same everywhere.

Pure: the parsers of ``rukpak`` and ``rukpak-provisioner`` are built and fed
arguments; nothing talks to a cluster or a registry.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from csi.common import errors
from csi.oci.reference import Reference
from provisioner import __main__ as provisioner_main
from provisioner.cli import flags
from provisioner.cli import main as cli
from provisioner.engine import inventory

CLUSTER = ["--kubeconfig", "/k", "--context", "c", "--system-namespace", "sys"]

COMMANDS = [
    pytest.param(cli.build_parser, ["apply", "DIR", "--name", "d"], id="rukpak apply"),
    pytest.param(cli.build_parser, ["diff", "DIR", "--name", "d"], id="rukpak diff"),
    pytest.param(cli.build_parser, ["status", "d"], id="rukpak status"),
    pytest.param(cli.build_parser, ["uninstall", "d"], id="rukpak uninstall"),
    pytest.param(
        provisioner_main.build_parser,
        ["instance", "--bundle-dir", "/b", "--name", "d"],
        id="rukpak-provisioner instance",
    ),
    pytest.param(provisioner_main.build_parser, ["manager"], id="rukpak-provisioner manager"),
]


@pytest.mark.parametrize(("parser", "argv"), COMMANDS)
def test_every_cluster_command_takes_the_same_cluster_flags(
    parser: Callable[[], argparse.ArgumentParser], argv: list[str]
) -> None:
    args = parser().parse_args([*argv, *CLUSTER])
    assert (args.kubeconfig, args.context, args.system_namespace) == ("/k", "c", "sys")
    defaults = parser().parse_args(argv)
    assert (defaults.kubeconfig, defaults.context) == (None, None)
    assert defaults.system_namespace == inventory.DEFAULT_SYSTEM_NAMESPACE


@pytest.mark.parametrize(
    "argv",
    [
        ["apply", "DIR", "--name", "d", "-n", "ns"],
        ["instance", "--bundle-dir", "/b", "--name", "d", "-n", "ns"],
    ],
)
def test_the_deployment_flags_agree(argv: list[str]) -> None:
    build = cli.build_parser if argv[0] == "apply" else provisioner_main.build_parser
    args = build().parse_args(argv)
    assert (args.name, args.namespace, args.format) == ("d", "ns", "plain+v0")


def test_insecure_names_only_the_registry_of_the_reference() -> None:
    ref = Reference.parse("registry.example:5000/b:v1")
    parser = argparse.ArgumentParser()
    flags.add_registry(parser, timeout=True)
    assert flags.insecure_hosts(parser.parse_args(["--insecure"]), ref) == (
        "registry.example:5000",
    )
    plain = parser.parse_args([])
    assert flags.insecure_hosts(plain, ref) == () and plain.timeout == 30.0


def test_registry_credentials_come_from_the_named_file_or_the_users_docker_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(["not", "an", "object"]))
    with pytest.raises(errors.InvalidArgument, match="must hold a JSON object"):
        flags.load_credentials(config)
    with pytest.raises(errors.InvalidArgument, match="check the --registry-config path"):
        flags.load_credentials(tmp_path / "missing.json")
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "no-docker-here"))
    assert flags.load_credentials(None) is None  # no file of the user's: anonymous
