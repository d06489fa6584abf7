"""``kubectl rukpak``: the CLI as a kubectl plugin, and its shell completion.

The real kubectl (built by ``make k8s-bins``) finds ``kubectl-rukpak`` on PATH (the
virtualenv's console scripts) and completes ``kubectl rukpak ...`` through
``kubectl_complete-rukpak``; the shells complete ``rukpak`` through the scripts ``rukpak
completion bash|zsh|fish`` print (``tests/test_cli_completion.py``). The candidate logic of
kubectl's protocol is also pinned down on its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.cli import complete
from provisioner.cli.main import build_parser
from tests.install_helpers import kubectl_binary

BIN = Path(sys.executable).parent


def kubectl(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    env["KUBECONFIG"] = os.devnull  # nothing here talks to a cluster
    return subprocess.run(
        [str(kubectl_binary()), *args], capture_output=True, text=True, env=env, timeout=60
    )


COMMANDS = [
    "apply",
    "approve",
    "bundle",
    "completion",
    "diff",
    "get",
    "history",
    "preview",
    "rollback",
    "status",
    "uninstall",
    "version",
]
"""Every ``rukpak`` subcommand, as completion offers them."""


@pytest.mark.parametrize(
    ("words", "expected", "directive"),
    [
        (
            [""],
            COMMANDS,
            4,
        ),
        (["bu"], ["bundle"], 4),
        (["bundle", ""], ["build", "inspect", "push", "sign", "verify"], 4),
        (["apply", "--na"], ["--name", "--namespace"], 4),
        (["-v", "bundle", "p"], ["push"], 4),
        (["apply", "--name", ""], [], 0),  # a flag's value: file names are fine
        (["apply", "--name=x", "./bun"], [], 0),  # a positional path
        (
            ["no-such-command", ""],
            COMMANDS,
            4,
        ),
    ],
)
def test_candidates_follow_the_parser(
    words: list[str], expected: list[str], directive: int
) -> None:
    assert complete.candidates(build_parser(), words) == (expected, directive)


def test_kubectl_runs_the_cli_as_its_rukpak_plugin() -> None:
    listed = kubectl("plugin", "list")
    assert str(BIN / "kubectl-rukpak") in listed.stdout, listed.stdout + listed.stderr
    helped = kubectl("rukpak", "--help")
    assert helped.returncode == 0, helped.stderr
    assert helped.stdout.startswith("usage: kubectl rukpak ")
    wrong = kubectl("rukpak", "no-such-command")
    assert wrong.returncode == 2
    assert "kubectl rukpak: error: argument COMMAND: invalid choice" in wrong.stderr


def test_kubectl_completes_the_plugin_through_kubectl_complete_rukpak() -> None:
    done = kubectl("__complete", "rukpak", "bundle", "")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["build", "inspect", "push", "sign", "verify", ":4"]
    flags = kubectl("__complete", "rukpak", "apply", "--no")
    assert flags.stdout.splitlines() == ["--no-prune", ":4"]
