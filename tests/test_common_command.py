"""``rukpak.common.command``: subcommands described by the docstrings of the functions that
run them, and configs built from parsed flags.

Where it sits: the unit tests of the helper every argparse program of the project registers
its subcommands with; the commands' own behaviour is tested beside each command
(``test_cli_*``, ``test_instance``). The words users see are checked whole by
``test_docs`` (the CLI reference is rendered from ``--help``).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import provisioner.__main__ as provisioner_main
from provisioner.cli import main as cli_main
from provisioner.cli import signing
from provisioner.instance import process
from provisioner.manager import cli as manager_cli
from provisioner.manager import model
from provisioner.runtime import flags
from rukpak.common import command, errors


def _run_described(args: argparse.Namespace) -> int:
    """do the thing

    Do the thing the long way, over
    two lines of source.

    A second paragraph.

    examples:
      tool thing --fast
      tool thing   # slowly

    exit status: 0 done; 1 an error; 3 it ran
    out of time
    """
    return 0


def _run_prose(args: argparse.Namespace) -> int:
    """do it

    Do it.

    exit status: 0 done
    """
    return 0


def _run_help_only(args: argparse.Namespace) -> int:
    """just a help line that
    goes on"""
    return 0


def _run_undocumented(args: argparse.Namespace) -> int:
    return 0


def _run_blank(args: argparse.Namespace) -> int:
    """ """
    return 0


def _run_headed(args: argparse.Namespace) -> int:
    """exit status: 0 always"""
    return 0


def _run_literal_first(args: argparse.Namespace) -> int:
    """usage:
      tool thing

    Runs the thing.
    """
    return 0


class TestWordsOfADocstring:
    def test_the_first_paragraph_is_the_help_and_prose_is_joined_into_lines(self) -> None:
        words = command.words_of(_run_described)
        assert words.help == "do the thing"
        assert words.description == (
            "Do the thing the long way, over two lines of source.\n\nA second paragraph."
        )

    def test_the_epilog_starts_at_the_first_heading_and_examples_keep_their_lines(self) -> None:
        words = command.words_of(_run_described)
        assert words.epilog == (
            "examples:\n  tool thing --fast\n  tool thing   # slowly\n\n"
            "exit status: 0 done; 1 an error; 3 it ran out of time"
        )
        assert words.as_written

    def test_prose_alone_is_left_to_argparse_to_fill(self) -> None:
        words = command.words_of(_run_prose)
        assert words == command.Words("do it", "Do it.", "exit status: 0 done", False)

    def test_a_help_line_alone_gives_no_description_and_no_epilog(self) -> None:
        words = command.words_of(_run_help_only)
        assert words == command.Words("just a help line that goes on", None, None, False)

    @pytest.mark.parametrize("run", [_run_undocumented, _run_blank])
    def test_a_function_without_a_docstring_is_refused_by_name(self, run: Any) -> None:
        with pytest.raises(ValueError, match=f"{run.__name__} has no docstring"):
            command.words_of(run)

    @pytest.mark.parametrize("run", [_run_headed, _run_literal_first])
    def test_a_docstring_must_open_with_a_help_line(self, run: Any) -> None:
        with pytest.raises(ValueError, match="must open with the command's help line"):
            command.words_of(run)


def _tool() -> tuple[argparse.ArgumentParser, Any]:
    parser = argparse.ArgumentParser(prog="tool")
    return parser, parser.add_subparsers(dest="command", required=True)


class TestAdd:
    def test_the_command_runs_its_function_and_shows_its_docstring(self) -> None:
        parser, subparsers = _tool()
        command.add(subparsers, "thing", _run_described)
        args = parser.parse_args(["thing"])
        assert args.func is _run_described
        thing = subparsers.choices["thing"]
        assert thing.formatter_class is argparse.RawDescriptionHelpFormatter
        assert "  tool thing   # slowly\n" in thing.format_help()
        assert "do the thing" in parser.format_help()

    def test_prose_only_help_is_filled_as_argparse_fills_it(self) -> None:
        _, subparsers = _tool()
        assert command.add(subparsers, "it", _run_prose).formatter_class is argparse.HelpFormatter

    def test_an_undocumented_function_fails_when_the_parser_is_built(self) -> None:
        _, subparsers = _tool()
        with pytest.raises(ValueError, match="_run_undocumented has no docstring"):
            command.add(subparsers, "thing", _run_undocumented)


def _commands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield name, sub
                yield from _commands(sub)


WORDS_OF_THEIR_OWN = {"volumes"}
"""Commands whose module still passes its words to ``add_parser`` (``provisioner.storage.cli``)."""


@pytest.mark.parametrize(
    "parser",
    [cli_main.build_parser(), provisioner_main.build_parser()],
    ids=["rukpak", "rukpak-provisioner"],
)
def test_every_command_is_described_by_the_function_that_runs_it(
    parser: argparse.ArgumentParser,
) -> None:
    for name, sub in _commands(parser):
        run = sub.get_default("func")
        if run is None or name in WORDS_OF_THEIR_OWN:  # a group (``rukpak bundle``)
            continue
        words = command.words_of(run)
        assert (sub.description, sub.epilog) == (words.description, words.epilog), name


def test_sign_names_the_password_variable_it_reads() -> None:
    assert f"${signing.PASSWORD_ENV}." in str(command.words_of(signing.run_sign).description)


@dataclasses.dataclass(frozen=True)
class _Config:
    name: str
    bundle_format: str = "plain+v0"
    lease_duration: float = 15.0
    kept: tuple[str, ...] = ()


class TestConfigFrom:
    def test_fields_come_from_flags_of_their_name_and_given_values_win(self) -> None:
        args = argparse.Namespace(name="a", format="helm", lease_duration=3.0, kept=["x"])
        config = command.config_from(_Config, args, bundle_format=args.format, kept=("x",))
        assert config == _Config(name="a", bundle_format="helm", lease_duration=3.0, kept=("x",))

    def test_a_field_without_a_flag_keeps_its_default(self) -> None:
        config = command.config_from(_Config, argparse.Namespace(name="a", other=1))
        assert config == _Config(name="a")

    def test_a_given_value_that_is_no_field_is_refused(self) -> None:
        with pytest.raises(TypeError):
            command.config_from(_Config, argparse.Namespace(name="a"), nmae="b")

    def test_a_class_that_is_no_dataclass_is_refused(self) -> None:
        with pytest.raises(TypeError, match="is not a dataclass"):
            command.config_from(argparse.Namespace, argparse.Namespace())  # type: ignore[type-var]


def test_the_manager_settings_are_its_flags() -> None:
    args = provisioner_main.build_parser("manager").parse_args(
        [
            "manager",
            "--image=reg/rukpak:1",
            "--system-namespace=sys",
            "--instance-service-account=inst",
            "--unpack-service-account=unp",
            "--instance-host-network",
            "--instance-env=A=1",
            "--max-concurrent-runs=3",
            "--run-mode=standing",
        ]
    )
    assert manager_cli.settings_from(args) == model.Settings(
        image="reg/rukpak:1",
        system_namespace="sys",
        service_account="inst",
        unpack_service_account="unp",
        host_network=True,
        env=(("A", "1"),),
        max_concurrent_runs=3,
        run_mode="standing",
        content_base_url="https://rukpak-webhook.sys.svc",
    )


def test_the_instance_config_is_its_flags(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    made: list[process.Config] = []

    def instance(kube: Any, config: process.Config) -> None:
        made.append(config)
        raise errors.Unavailable("stop here")

    monkeypatch.setattr(flags, "kube", lambda args: None)
    monkeypatch.setattr(process, "Instance", instance)
    args = provisioner_main.build_parser("instance").parse_args(
        [
            "instance",
            f"--bundle-dir={tmp_path}",
            "--name=web",
            "--namespace=apps",
            "--system-namespace=sys",
            "--identity=me",
            "--lease-duration=5",
            "--lease-timeout=7",
            "--format=helm",
            f"--termination-log={tmp_path / 'log'}",
            "--bundle=web-1",
            "--source-dir=a",
            "--source-dir=b",
            "--preview",
        ]
    )
    assert process.run_instance(args) == process.EXIT_ERROR
    assert made == [
        process.Config(
            bundle_dir=tmp_path,
            name="web",
            namespace="apps",
            system_namespace="sys",
            identity="me",
            lease_duration=5.0,
            lease_timeout=7.0,
            bundle_format="helm",
            termination_log=tmp_path / "log",
            bundle_name="web-1",
            source_dirs=(Path("a"), Path("b")),
            preview=True,
            ignore=(),
        )
    ]
