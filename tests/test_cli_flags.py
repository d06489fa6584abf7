"""The flags every command shares (``provisioner.runtime.flags``, ``rukpak.common.flags``) mean
the same everywhere.

Pure: the parsers of ``rukpak``, ``rukpak-provisioner`` and ``rukpak-csi-plugin`` are
built and fed arguments; nothing talks to a cluster or a registry.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from csi.plugin import main as plugin_main
from provisioner import __main__ as provisioner_main
from provisioner.cli import main as cli
from provisioner.engine.apply import inventory
from provisioner.runtime import flags, termination
from rukpak.common import errors
from rukpak.oci.reference import Reference

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


# -- the flags of the in-cluster processes ---------------------------------------------------

MOUNTED = ["--bundle-dir", "/b"]


PLUGIN = plugin_main.build_parser
PROVISIONER = provisioner_main.build_parser


@pytest.mark.parametrize(
    ("parser", "argv", "flag", "env", "default"),
    [
        pytest.param(PLUGIN, [], "--log-level", "LOG_LEVEL", "INFO", id="plugin log level"),
        pytest.param(
            PROVISIONER, ["manager"], "--log-level", "LOG_LEVEL", "INFO", id="provisioner log level"
        ),
        pytest.param(PLUGIN, [], "--driver-name", "DRIVER_NAME", "csi.rukpak.io", id="plugin"),
        pytest.param(
            PROVISIONER, ["volumes"], "--driver-name", "DRIVER_NAME", "csi.rukpak.io", id="volumes"
        ),
    ],
)
def test_the_flags_of_every_process_fall_back_to_the_same_environment_variables(
    parser: Callable[[], argparse.ArgumentParser],
    argv: list[str],
    flag: str,
    env: str,
    default: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    dest = flag.lstrip("-").replace("-", "_")
    monkeypatch.delenv(env, raising=False)
    assert getattr(parser().parse_args(argv), dest) == default
    given = [flag, "GIVEN", *argv] if flag == "--log-level" else [*argv, flag, "GIVEN"]
    assert getattr(parser().parse_args(given), dest) == "GIVEN"
    monkeypatch.setenv(env, "FROM-ENV")
    assert getattr(parser().parse_args(argv), dest) == "FROM-ENV"


@pytest.mark.parametrize("command", ["instance", "unpack"])
def test_the_pod_processes_take_the_mounted_bundle_format_and_termination_log_alike(
    command: str,
) -> None:
    extra = ["--name", "d"] if command == "instance" else []
    argv = [command, *MOUNTED, *extra, "--format", "registry+v1", "--termination-log", "/t"]
    args = provisioner_main.build_parser().parse_args(argv)
    assert (args.bundle_dir, args.format, args.termination_log) == (
        Path("/b"),
        "registry+v1",
        Path("/t"),
    )
    defaults = provisioner_main.build_parser().parse_args([command, *MOUNTED, *extra])
    assert (defaults.format, defaults.termination_log) == ("plain+v0", None)
    with pytest.raises(SystemExit):
        provisioner_main.build_parser().parse_args([command, *extra])  # --bundle-dir is required


@pytest.mark.parametrize("command", ["manager", "volumes"])
def test_the_controllers_take_leader_election_and_workers_alike(command: str) -> None:
    args = provisioner_main.build_parser().parse_args([command, "--leader-elect", "--workers", "5"])
    assert (args.leader_elect, args.workers) == (True, 5)
    defaults = provisioner_main.build_parser().parse_args([command])
    assert (defaults.leader_elect, defaults.workers) == (False, 2)


def test_the_termination_log_defaults_to_the_pods_own_only_when_it_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert termination.where(tmp_path / "named") == tmp_path / "named"
    monkeypatch.setattr(termination, "DEFAULT", tmp_path / "termination-log")
    assert termination.where(None) is None
    termination.DEFAULT.touch()
    assert termination.where(None) == termination.DEFAULT
    termination.write(termination.DEFAULT, "x" * (termination.MESSAGE_LIMIT + 10))
    assert termination.DEFAULT.read_text() == "x" * termination.MESSAGE_LIMIT
    termination.write(tmp_path / "no-such-dir" / "log", "lost")  # best effort: no raise
