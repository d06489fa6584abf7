"""``rukpak apply|diff|status|uninstall`` end to end against a real kube-apiserver."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from provisioner.cli import main as cli
from tests.bundles import configmap, namespace, write_bundle

pytestmark = pytest.mark.cluster


def rukpak(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def rows(table: str) -> list[list[str]]:
    return [line.split() for line in table.splitlines()]


def test_the_cli_applies_diffs_reports_and_uninstalls(
    kube_apiserver: Any, name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kc = ["--kubeconfig", str(kube_apiserver.kubeconfig)]
    root = tmp_path / "bundle"
    write_bundle(root, {"a.yaml": [namespace(name), configmap("a", k="1"), configmap("b")]})

    code, out, err = rukpak(capsys, "diff", str(root), "--name", name, "-n", name, *kc)
    assert code == 3 and f"create    ConfigMap {name}/a" in out

    code, out, err = rukpak(capsys, "apply", str(root), "--name", name, "-n", name, *kc)
    assert code == 0, err
    assert f"deployment {name}: applied 3 objects, pruned 0" in out
    assert "applying config: 2 objects" in err

    code, out, err = rukpak(capsys, "diff", str(root), "--name", name, "-n", name, *kc)
    assert (code, out) == (0, "")

    write_bundle(root, {"a.yaml": [namespace(name), configmap("a", k="2")]})
    code, out, err = rukpak(capsys, "diff", str(root), "--name", name, "-n", name, *kc)
    assert code == 3
    assert f"prune     ConfigMap {name}/b" in out and "+  k: '2'" in out

    code, out, err = rukpak(capsys, "status", name, *kc)
    assert code == 0 and ["ready", "ConfigMap", f"{name}/a"] in rows(out)

    code, out, err = rukpak(capsys, "uninstall", name, "--deletion-policy", "Orphan", *kc)
    assert code == 0 and "orphaned 3" in out

    code, out, err = rukpak(capsys, "status", name, *kc)
    assert code == 1 and f"error: no deployment '{name}'" in err


def test_cli_errors_name_the_file_and_exit_1(
    kube_apiserver: Any, name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests" / "bad.yaml").write_text("kind: [\n")
    code, _, err = rukpak(
        capsys,
        "apply",
        str(tmp_path),
        "--name",
        name,
        "--kubeconfig",
        str(kube_apiserver.kubeconfig),
    )
    assert code == 1 and err.startswith("error: ") and "manifests/bad.yaml document 1" in err


def test_the_cli_applies_a_bundle_image_from_a_registry(
    kube_apiserver: Any,
    registry: Any,
    name: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = tmp_path / "bundle"
    write_bundle(root, {"a.yaml": [namespace(name), configmap("from-image", k="v")]})
    image = f"{registry.host}/bundles/{name}:v1"
    code, _, err = rukpak(capsys, "bundle", "push", "--from-dir", str(root), image)
    assert code == 0, err
    kc = ["--kubeconfig", str(kube_apiserver.kubeconfig)]
    code, out, err = rukpak(capsys, "apply", image, "--name", name, "-n", name, *kc)
    assert code == 0, err
    assert f"pulling {image}" in err and "applied 2 objects" in out
    code, out, _ = rukpak(capsys, "status", name, *kc)
    assert code == 0 and ["ready", "ConfigMap", f"{name}/from-image"] in rows(out)
