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


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=shell_env(), timeout=60)


def needs(shell: str) -> str:
    found = shutil.which(shell)
    if found is None:
        pytest.fail(f"{shell} is not installed: run make setup (hack/setup.sh installs it)")
    return found


@pytest.fixture(params=complete.SHELLS)
def script(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, Path]:
    shell = str(request.param)
    printed = run([str(BIN / "rukpak"), "completion", shell])
    assert printed.returncode == 0, printed.stderr
    path = tmp_path / f"rukpak.{shell}"
    path.write_text(printed.stdout)
    return shell, path


def test_each_shell_accepts_the_script_it_is_given(script: tuple[str, Path]) -> None:
    shell, path = script
    checked = run([needs(shell), "-n", str(path)])
    assert checked.returncode == 0, checked.stderr
    assert "rukpak" in path.read_text() and "kubectl-rukpak" in path.read_text()


def bash_complete(path: Path, line: str) -> list[str]:
    words = line.split(" ")
    probe = (
        f"source {path}; COMP_LINE={line!r}; COMP_POINT=${{#COMP_LINE}}; "
        f"COMP_WORDS=({' '.join(repr(w) for w in words)}); COMP_CWORD={len(words) - 1}; "
        f'_python_argcomplete {words[0]}; printf "%s\\n" "${{COMPREPLY[@]}}"'
    )
    done = run(["bash", "-c", probe])
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


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
    (tmp_path / "rukpak.bash").write_text(complete.script("bash"))
    assert bash_complete(tmp_path / "rukpak.bash", line) == expected


def test_zsh_registers_and_completes_both_commands(tmp_path: Path) -> None:
    zsh = needs("zsh")
    (tmp_path / "rukpak.zsh").write_text(complete.script("zsh"))
    # compinit for compdef; _describe (which needs a live completion widget) replaced by
    # one that prints the candidates it is handed
    probe = (
        f"autoload -U compinit; compinit -u -D; source {tmp_path / 'rukpak.zsh'}; "
        "print -r -- $_comps[rukpak] $_comps[kubectl-rukpak]; "
        "_describe() { print -rl -- ${(P)2}; }; "
        'words=(kubectl-rukpak bundle i); BUFFER="kubectl-rukpak bundle i"; '
        "CURSOR=${#BUFFER}; _python_argcomplete"
    )
    done = run([zsh, "-f", "-c", probe])
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "_python_argcomplete _python_argcomplete"
    assert [line.split(":")[0] for line in lines[1:]] == ["inspect"]


def test_fish_completes_both_commands(tmp_path: Path) -> None:
    fish = needs("fish")
    (tmp_path / "rukpak.fish").write_text(complete.script("fish"))
    probe = (
        f"source {tmp_path / 'rukpak.fish'}; complete -C 'rukpak bundle i'; "
        "complete -C 'kubectl-rukpak get -o y'"
    )
    done = run([fish, "-c", probe])
    assert done.returncode == 0, done.stderr
    assert [line.split("\t")[0] for line in done.stdout.splitlines()] == ["inspect", "yaml"]


def test_only_the_three_shells_have_a_script(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["completion", "tcsh"])
    assert exited.value.code == 2
    assert "invalid choice: 'tcsh' (choose from 'bash', 'zsh', 'fish')" in capsys.readouterr().err
    with pytest.raises(ValueError, match="no completion for shell 'tcsh'"):
        complete.script("tcsh")
