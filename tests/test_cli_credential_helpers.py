"""Docker credential helpers (``credHelpers``, ``credsStore``) in the commands that talk to a
registry, through ``rukpak.oci.dockerconfig``.

Each helper is a real executable ``docker-credential-<name>`` that the test writes on PATH;
it records what it was asked (its argument and stdin) and answers as the test tells it.
Against the real registry with basic auth (``auth_registry``) and with token auth and an
identity token (``token_registry``); the ways a helper goes wrong are run against the helper
alone: missing, failing, printing garbage, hanging past the timeout.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from provisioner.cli import main as cli
from rukpak.common import errors
from rukpak.oci import auth, dockerconfig
from tests.polling import eventually
from tests.registry import RegistryServer

SECRET = "s3cr3t-never-shown"


def bundle(root: Path) -> Path:
    (root / "manifests").mkdir(parents=True)
    (root / "manifests" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cm}\ndata: {k: v}\n"
    )
    return root


class Helper:
    """``docker-credential-<name>`` in ``bin``: prints ``answer`` (exit ``status``) after
    writing its argument and stdin to ``asked``, one line a call."""

    def __init__(self, bin_dir: Path, name: str, body: str) -> None:
        self.asked = bin_dir / f"{name}.asked"
        self.path = bin_dir / f"{dockerconfig.HELPER_PREFIX}{name}"
        self.path.write_text(
            f'#!/bin/sh\nserver=$(cat); echo "$1 $server" >> {self.asked}\n{body}\n'
        )
        self.path.chmod(self.path.stat().st_mode | stat.S_IXUSR)

    @classmethod
    def answering(cls, bin_dir: Path, name: str, answer: object, status: int = 0) -> Helper:
        text = answer if isinstance(answer, str) else json.dumps(answer)
        return cls(bin_dir, name, f"printf '%s' '{text}'; exit {status}")

    @classmethod
    def knowing(cls, bin_dir: Path, name: str, registry: RegistryServer) -> Helper:
        """A helper that answers with ``registry``'s user name and password."""
        return cls.answering(
            bin_dir, name, {"Username": registry.username, "Secret": registry.password}
        )

    def calls(self) -> list[str]:
        return self.asked.read_text().splitlines() if self.asked.exists() else []


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    where = tmp_path / "bin"
    where.mkdir()
    monkeypatch.setenv("PATH", f"{where}{os.pathsep}{os.environ.get('PATH', '')}")
    return where


def rukpak(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def docker_config(path: Path, document: object) -> Path:
    path.write_text(json.dumps(document))
    return path


def push(capsys: pytest.CaptureFixture[str], tmp_path: Path, ref: str, config: Path) -> str:
    """``rukpak bundle push`` of a small bundle as ``ref`` with the registry config
    ``config``, which must succeed; what it wrote on stderr."""
    code, _, err = rukpak(
        capsys, "bundle", "push", "--from-dir", bundle(tmp_path / "b"), ref,
        "--registry-config", config,
    )  # fmt: skip
    assert code == 0, err
    return err


@pytest.mark.registry
def test_a_registrys_credential_helper_signs_the_push_and_the_inspect(
    auth_registry: RegistryServer, bin_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    helper = Helper.knowing(bin_dir, "rk-test", auth_registry)
    other = Helper.answering(bin_dir, "rk-default", {"Username": "nobody", "Secret": "wrong"})
    config = docker_config(
        tmp_path / "config.json",
        {"credHelpers": {auth_registry.host: "rk-test"}, "credsStore": "rk-default"},
    )
    ref = f"{auth_registry.host}/helpers/per-registry:v1"
    push(capsys, tmp_path, ref, config)
    assert helper.calls() == [f"get {auth_registry.host}"]  # once, for its host; on stdin
    assert other.calls() == []  # credHelpers wins over credsStore
    code, out, err = rukpak(
        capsys, "bundle", "inspect", ref, "--registry-config", config, "-o", "name"
    )
    assert code == 0, err
    assert out.startswith(f"{auth_registry.host}/helpers/per-registry@sha256:")
    assert str(auth_registry.password) not in out + err


@pytest.mark.registry
def test_the_default_store_answers_for_every_registry_and_may_know_nothing(
    auth_registry: RegistryServer, bin_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = Helper.knowing(bin_dir, "rk-store", auth_registry)
    config = docker_config(tmp_path / "config.json", {"auths": {}, "credsStore": "rk-store"})
    ref = f"{auth_registry.host}/helpers/store:v1"
    push(capsys, tmp_path, ref, config)
    assert store.calls() == [f"get {auth_registry.host}"]

    Helper.answering(bin_dir, "rk-empty", dockerconfig.NOT_FOUND, status=1)
    empty = docker_config(tmp_path / "empty.json", {"credsStore": "rk-empty"})
    code, _, err = rukpak(capsys, "bundle", "inspect", ref, "--registry-config", empty)
    assert code == 1 and "requires authentication" in err  # asked anonymously


@pytest.mark.registry
def test_the_user_name_token_makes_the_secret_an_identity_token(
    token_registry: RegistryServer,
    bin_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    issuer = token_registry.token_issuer
    assert issuer is not None and token_registry.username
    refresh = issuer.new_refresh_token(token_registry.username)
    Helper.answering(bin_dir, "rk-token", {"Username": "<token>", "Secret": refresh})
    config = docker_config(
        tmp_path / "config.json", {"credHelpers": {token_registry.host: "rk-token"}}
    )
    ref = f"{token_registry.host}/helpers/token:v1"
    err = push(capsys, tmp_path, ref, config)
    assert refresh not in err


# -- a helper that goes wrong ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "error", "words"),
    [
        (None, errors.FailedPrecondition, "docker-credential-rk-bad (for registry r.example) "
         "is not on PATH"),
        (f"echo 'cannot unlock {SECRET}' >&2; exit 3", errors.FailedPrecondition,
         "docker credential helper docker-credential-rk-bad failed for registry r.example "
         "(exit status 3)"),
        (f"echo 'not json {SECRET}'", errors.FailedPrecondition,
         "docker credential helper docker-credential-rk-bad answered for registry r.example "
         "with something other than JSON"),
        (f'echo \'{{"Username": 7, "Secret": "{SECRET}"}}\'', errors.FailedPrecondition,
         "with something other than JSON"),
    ],
    ids=["missing", "exits non-zero", "garbage", "wrong types"],
)  # fmt: skip
def test_a_helper_that_goes_wrong_is_named_and_its_output_never_shown(
    bin_dir: Path, body: str | None, error: type[errors.RukpakError], words: str
) -> None:
    if body is not None:
        Helper(bin_dir, "rk-bad", body)
    credentials = dockerconfig.parse(json.dumps({"credsStore": "rk-bad"}), where="config.json")
    with pytest.raises(error) as caught:
        credentials.for_host("r.example")
    assert words in caught.value.message
    assert SECRET not in caught.value.message


def test_a_helper_that_hangs_is_killed_with_what_it_started(bin_dir: Path) -> None:
    pid_file = bin_dir / "child.pid"
    Helper(bin_dir, "rk-hang", f"sleep 600 & echo $! > {pid_file}; wait")
    with pytest.raises(errors.Unavailable) as caught:
        dockerconfig.get("rk-hang", "r.example", timeout=1.0)
    assert caught.value.message == (
        "docker credential helper docker-credential-rk-hang did not answer for registry "
        "r.example within 1s"
    )
    child = int(pid_file.read_text())
    eventually(lambda: not _running(child), what=f"the helper's child {child} to be gone")


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


@pytest.mark.parametrize(
    ("document", "words"),
    [
        ({"credHelpers": ["gcloud"]}, "'credHelpers' must map registry hosts to helper names"),
        ({"credHelpers": {"gcr.io": ""}}, "'credHelpers' must map registry hosts"),
        ({"credsStore": 7}, "'credsStore' must be a helper name"),
    ],
)
def test_a_config_that_names_helpers_badly_is_refused(document: object, words: str) -> None:
    with pytest.raises(errors.InvalidArgument, match=words):
        dockerconfig.parse(json.dumps(document), where="config.json")


def test_docker_hub_is_asked_by_the_address_docker_stores_it_under(bin_dir: Path) -> None:
    helper = Helper.answering(bin_dir, "rk-hub", {"Username": "u", "Secret": SECRET})
    credentials = dockerconfig.parse(
        json.dumps({"credHelpers": {"https://index.docker.io/v1/": "rk-hub"}}), where="c"
    )
    found = credentials.for_host("registry-1.docker.io")
    assert found == auth.Credential(username="u", password=SECRET)
    assert credentials.for_host("docker.io") is found  # asked once per host
    assert helper.calls() == ["get https://index.docker.io/v1/"]
    assert SECRET not in repr(credentials) + repr(found)


def test_without_helpers_the_auths_alone_are_read(tmp_path: Path) -> None:
    plain = dockerconfig.parse(
        json.dumps({"auths": {"r.example": {"username": "u", "password": "p"}}}), where="c"
    )
    assert type(plain) is auth.Credentials
    assert plain.for_host("r.example") == auth.Credential(username="u", password="p")
