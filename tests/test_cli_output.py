"""``-o json|yaml|wide|name``: one helper (``provisioner.cli.output``) behind every read
command, and the views each command hands it; the CLI's start-up.

Pure, apart from the start-up test, which runs ``rukpak --help`` as a process.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric import ec

from provisioner.cli import apply as apply_cli
from provisioner.cli import deployments, get, output, version
from provisioner.cli import main as cli
from provisioner.engine.apply import apply, inventory
from provisioner.engine.apply.lifecycle import ObjectStatus
from provisioner.engine.bundle import formats
from provisioner.engine.health import health
from provisioner.engine.objects import ObjectRef
from provisioner.engine.preview import diff
from provisioner.runtime import flags
from tests import signing_helpers
from tests.registry import RegistryServer
from tests.test_cli_deployments import bd, kept

ROOT = Path(__file__).resolve().parent.parent
READ_COMMANDS = [
    (["status"], ["x"]),
    (["diff"], ["dir", "--name", "x"]),
    (["history"], ["x"]),
    (["preview"], ["x"]),
    (["get"], []),
    (["bundle", "inspect"], ["r.example/x:v1"]),
    (["bundle", "verify"], ["r.example/x:v1", "--key", "k.pub"]),
]


def subparser(parser: argparse.ArgumentParser, *path: str) -> argparse.ArgumentParser:
    for word in path:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                parser = action.choices[word]
                break
    return parser


@pytest.mark.parametrize(("words", "rest"), READ_COMMANDS, ids=lambda a: " ".join(a))
def test_every_read_command_takes_the_same_output_flag(words: list[str], rest: list[str]) -> None:
    parser = cli.build_parser()
    for fmt in ("json", "yaml", "wide", "name"):
        assert parser.parse_args([*words, *rest, "-o", fmt]).output == fmt
    assert parser.parse_args([*words, *rest]).output == output.TABLE
    option = subparser(parser, *words)._option_string_actions["-o"]
    assert option.choices == output.FORMATS


def test_an_unknown_output_format_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["get", "-o", "jsonpath"])
    assert exited.value.code == 2
    assert "argument -o/--output: invalid choice: 'jsonpath'" in capsys.readouterr().err


VIEW = output.View(
    document={"items": [{"name": "a"}]},
    names=["thing/a", "thing/bb"],
    columns=("NAME", "STATE"),
    rows=[("a", "Ready"), ("bb", "Not ready")],
    wide_columns=("WHERE",),
    wide=[("here",), ("there",)],
    heading="things",
)


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        ("table", "things\nNAME  STATE\na     Ready\nbb    Not ready\n"),
        ("wide", "things\nNAME  STATE      WHERE\na     Ready      here\nbb    Not ready  there\n"),
        ("name", "thing/a\nthing/bb\n"),
        ("json", '{\n  "items": [\n    {\n      "name": "a"\n    }\n  ]\n}\n'),
        ("yaml", "items:\n- name: a\n"),
    ],
)
def test_one_view_in_each_format(fmt: str, expected: str) -> None:
    assert output.render(VIEW, fmt) == expected


def test_an_empty_table_says_so_on_stderr_only(capsys: pytest.CaptureFixture[str]) -> None:
    output.emit(output.View(document=[], names=[], columns=("NAME",), empty="none here"), "table")
    assert capsys.readouterr() == ("", "none here\n")
    output.emit(output.View(document=[], names=[], columns=("NAME",), empty="none"), "json")
    assert capsys.readouterr() == ("[]\n", "")


def test_status_names_each_object_as_kubectl_does() -> None:
    states = [
        ObjectStatus(ObjectRef("", "v1", "ConfigMap", "ns", "a"), None, health.READY),
        ObjectStatus(
            ObjectRef("apps", "v1", "Deployment", "ns", "d"), None, health.Health(False, "0/1")
        ),
    ]
    view = apply_cli.status_view("app", states)
    assert output.render(view, "name") == "configmap/a\ndeployment.apps/d\n"
    table = [line.split() for line in output.render(view, "wide").splitlines()]
    assert table[0] == ["STATUS", "OBJECT", "REASON", "API", "VERSION"]
    assert table[2] == ["NOT", "READY", "Deployment.apps", "ns/d", "0/1", "apps/v1"]
    document = json.loads(output.render(view, "json"))
    assert document["objects"][1] == {
        "apiVersion": "apps/v1", "kind": "Deployment", "namespace": "ns", "name": "d",
        "ready": False, "reason": "0/1",
    }  # fmt: skip


def test_diff_lists_what_would_change_with_its_unified_diff() -> None:
    cm = ObjectRef("", "v1", "ConfigMap", "ns", "a")
    web = ObjectRef("apps", "v1", "Deployment", "ns", "web")
    changes = [
        diff.Change(cm, "update", "-  k: '1'\n+  k: '2'\n"),
        diff.Change(web, "unchanged"),
        diff.Change(ObjectRef("", "v1", "ConfigMap", "ns", "b"), "prune"),
    ]
    view = apply_cli.diff_view(changes)
    assert output.render(view, "table") == (
        "update    ConfigMap ns/a\n-  k: '1'\n+  k: '2'\nprune     ConfigMap ns/b\n"
    )
    assert output.render(view, "name") == "configmap/a\nconfigmap/b\n"
    assert [c["action"] for c in json.loads(output.render(view, "json"))["changes"]] == [
        "update", "prune"
    ]  # fmt: skip


@pytest.mark.registry
def test_verify_says_what_it_verified_in_json(
    registry: RegistryServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "b" / "manifests"
    root.mkdir(parents=True)
    (root / "cm.yaml").write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n")
    key = ec.generate_private_key(ec.SECP256R1())
    (tmp_path / "k.key").write_bytes(signing_helpers.private_pem(key))
    (tmp_path / "k.pub").write_bytes(signing_helpers.public_pem(key))
    ref = f"{registry.host}/output/verify:v1"
    assert cli.main(["bundle", "push", "--from-dir", str(tmp_path / "b"), ref]) == 0
    assert cli.main(["bundle", "sign", ref, "--key", str(tmp_path / "k.key")]) == 0
    capsys.readouterr()
    assert cli.main(["bundle", "verify", ref, "--key", str(tmp_path / "k.pub"), "-o", "json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["verified"] is True and said["reference"] == f"{registry.host}/output/verify"
    assert said["digest"].startswith("sha256:") and said["signatures"] == 1


def test_history_gives_every_kept_revision_in_full_as_yaml() -> None:
    the_bd = bd(revisions=[kept(1), kept(2)], installedRevision=2, previousRevision=1)
    view = deployments.history_view(the_bd)
    document = yaml.safe_load(output.render(view, "yaml"))
    assert (document["installedRevision"], document["previousRevision"]) == (2, 1)
    assert [r["revision"] for r in document["revisions"]] == [1, 2]
    assert output.render(view, "name") == "bundledeployment.core.rukpak.io/app\n"
    assert output.render(view, "wide").splitlines()[1].split()[-3:] == [
        "RECORD", "INSTALLED", "AT"
    ]  # fmt: skip


def test_get_shows_the_printer_columns_of_v1alpha2() -> None:
    now = datetime.datetime(2026, 11, 28, 12, 0, tzinfo=datetime.UTC)
    one = {
        "metadata": {"name": "app", "creationTimestamp": "2026-11-28T09:00:00Z"},
        "spec": {"provisionerClassName": "core-rukpak-io-plain", "paused": True},
        "status": {
            "installedRevision": 3,
            "conditions": [
                {"type": "Installed", "status": "True", "reason": "InstallationSucceeded"},
                {"type": "Healthy", "status": "True"},
            ],
        },
    }
    view = get.view([one], one=False, now=now)
    rows = [line.split() for line in output.render(view, "wide").splitlines()]
    assert rows[1] == ["app", "InstallationSucceeded", "True", "3", "3h", "core-rukpak-io-plain",
                       "true"]  # fmt: skip
    assert json.loads(output.render(view, "json"))["kind"] == "List"
    assert json.loads(output.render(get.view([one], one=True, now=now), "json")) == one


@pytest.mark.parametrize(
    ("created", "shown"),
    [("2026-11-28T11:59:30Z", "30s"), ("2026-11-28T11:50:00Z", "10m"),
     ("2026-11-26T12:00:00Z", "2d"), ("yesterday", "<unknown>")],
)  # fmt: skip
def test_ages_are_short(created: str, shown: str) -> None:
    assert get.age(created, datetime.datetime(2026, 11, 28, 12, 0, tzinfo=datetime.UTC)) == shown


@pytest.mark.parametrize(
    ("image", "labels", "expected"),
    [
        ("host:5000/rukpak:v1.2.0", {}, "v1.2.0"),
        (f"host/rukpak@sha256:{'a' * 64}", {}, f"sha256:{'a' * 64}"),
        ("rukpak", {}, "unknown"),
        ("host/rukpak:v1", {"app.kubernetes.io/version": "1.0.0"}, "1.0.0"),
    ],
)
def test_the_managers_version_is_its_label_else_its_image_tag(
    image: str, labels: dict[str, str], expected: str
) -> None:
    deployment = {
        "metadata": {"labels": labels},
        "spec": {"template": {"spec": {"containers": [{"name": "manager", "image": image}]}}},
    }
    assert version.manager_version(deployment) == {"version": expected, "image": image}


def test_version_flag_prints_the_clients_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.kubectl_main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"kubectl rukpak {version.client_version()}\n"
    assert version.client_version() != "unknown"  # the package is installed


def test_the_flags_defaults_are_the_engines() -> None:
    assert flags.DEFAULT_SYSTEM_NAMESPACE == inventory.DEFAULT_SYSTEM_NAMESPACE
    assert flags.DEFAULT_FORMAT == formats.DEFAULT_FORMAT
    assert apply.Options.concurrency == apply_cli.DEFAULT_CONCURRENCY


def test_building_the_parser_imports_none_of_the_heavy_modules() -> None:
    """What keeps ``rukpak --help`` quick (its time: ``python -m tests.bench cli``)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "provisioner.cli.main", "--help"], capture_output=True, env=env,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    imported = subprocess.run(
        [sys.executable, "-c", "import sys, provisioner.cli.main as m; m.build_parser(); "
         "print(' '.join(sorted(sys.modules)))"],
        capture_output=True, text=True, env=env, timeout=60, check=True,
    ).stdout.split()  # fmt: skip
    heavy = {
        "kubernetes",
        "requests",
        "oras",
        "cryptography",
        "provisioner.engine.apply.apply",
        "yaml",
    }
    assert heavy.isdisjoint(imported)
