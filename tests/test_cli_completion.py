"""``rukpak completion bash|zsh|fish``: argcomplete's scripts, accepted and run by each shell.

Each script is checked by its shell's parser (``bash -n``, ``zsh -n``, ``fish -n``), then
sourced and asked to complete, so the real ``rukpak``/``kubectl-rukpak`` console scripts
of the virtualenv answer through argcomplete. bash always runs; zsh and fish are in
hack/setup.sh's Debian packages (the tests skip, saying so, where they are missing).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from provisioner.cli import complete
from provisioner.cli import main as cli

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parent.parent


def shell_env() -> dict[str, str]:
    """The virtualenv's console scripts first on PATH, importing this checkout."""
    path = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    python_path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PATH": path, "PYTHONPATH": python_path}


def run(argv: list[str]) -> str:
    """The output of ``argv``, run in :func:`shell_env`; it must succeed."""
    done = subprocess.run(argv, capture_output=True, text=True, env=shell_env(), timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def written(tmp_path: Path, shell: str) -> Path:
    """``complete.script(shell)`` written to a file for the shell to source."""
    path = tmp_path / f"rukpak.{shell}"
    path.write_text(complete.script(shell))
    return path


def needs(shell: str) -> str:
    found = shutil.which(shell)
    if found is None:
        pytest.fail(f"{shell} is not installed: run make setup (hack/setup.sh installs it)")
    return found


@pytest.fixture(params=complete.SHELLS)
def script(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path]:
    shell = str(request.param)
    path = tmp_path / f"rukpak.{shell}"
    path.write_text(run([str(BIN / "rukpak"), "completion", shell]))
    return shell, path


def test_each_shell_accepts_the_script_it_is_given(script: tuple[str, Path]) -> None:
    shell, path = script
    run([needs(shell), "-n", str(path)])
    assert "rukpak" in path.read_text() and "kubectl-rukpak" in path.read_text()


def bash_complete(path: Path, line: str) -> list[str]:
    words = line.split(" ")
    probe = (
        f"source {path}; COMP_LINE={line!r}; COMP_POINT=${{#COMP_LINE}}; "
        f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}; "
        f'_python_argcomplete {words[0]}; printf "%s\\n" "${{COMPREPLY[@]}}"'
    )
    return run(["bash", "-c", probe]).split()


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("rukpak bundle i", ["inspect"]),
        ("rukpak ap", ["apply", "approve"]),
        ("kubectl-rukpak status app -o ", ["json", "yaml", "wide", "name"]),
        ("rukpak completion z", ["zsh"]),
        ("rukpak approve app --pre", ["--preview-digest"]),
    ],
)
def test_bash_completes_commands_flags_and_choices(
    tmp_path: Path, line: str, expected: list[str]
) -> None:
    assert bash_complete(written(tmp_path, "bash"), line) == expected


def test_zsh_registers_and_completes_both_commands(tmp_path: Path) -> None:
    zsh = needs("zsh")
    path = written(tmp_path, "zsh")
    # compinit for compdef; _describe (which needs a live completion widget) replaced by
    # one that prints the candidates it is handed
    probe = (
        f"autoload -U compinit; compinit -u -D; source {path}; "
        "print -r -- $_comps[rukpak] $_comps[kubectl-rukpak]; "
        "_describe() { print -rl -- ${(P)2}; }; "
        'words=(kubectl-rukpak bundle i); BUFFER="kubectl-rukpak bundle i"; '
        "CURSOR=${#BUFFER}; _python_argcomplete"
    )
    lines = run([zsh, "-f", "-c", probe]).splitlines()
    assert lines[0] == "_python_argcomplete _python_argcomplete"
    assert [line.split(":")[0] for line in lines[1:]] == ["inspect"]


def test_fish_completes_both_commands(tmp_path: Path) -> None:
    fish = needs("fish")
    probe = (
        f"source {written(tmp_path, 'fish')}; complete -C 'rukpak bundle i'; "
        "complete -C 'kubectl-rukpak get -o y'"
    )
    completed = run([fish, "-c", probe]).splitlines()
    assert [line.split("\t")[0] for line in completed] == ["inspect", "yaml"]


def test_only_the_three_shells_have_a_script(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["completion", "tcsh"])
    assert exited.value.code == 2
    assert "invalid choice: 'tcsh' (choose from 'bash', 'zsh', 'fish')" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no completion for shell 'tcsh'"):
        complete.script("tcsh")
