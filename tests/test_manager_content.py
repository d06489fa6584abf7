"""Pure parts of the manager's content server and ConfigMap admission: which paths name
content (hostile ones refused) and when a ConfigMap deletion is denied. Served for real,
with ServiceAccount tokens and the API server's reviews, in ``test_e2e_v1alpha2`` and
``test_e2e_sources``."""

from __future__ import annotations

import pytest

from provisioner.manager import model
from provisioner.manager.serving import content, webhook


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("/bundles/hello.tgz", "hello"),
        ("/bundles/hello-abc.def.tgz", "hello-abc.def"),
        ("/bundles/../etc/passwd.tgz", None),
        ("/bundles/a/b.tgz", None),
        ("/bundles/.tgz", None),
        ("/bundles/Hello.tgz", None),
        ("/bundles/hello.tar", None),
        ("/other/hello.tgz", None),
        ("/bundles/" + "a" * 254 + ".tgz", None),
    ],
)
def test_only_a_plain_object_name_is_a_content_path(path: str, name: str | None) -> None:
    assert content.name_of_path(path) == name


def test_the_content_url_is_under_the_base() -> None:
    assert (
        model.content_url("https://h.example:9443/", "x") == "https://h.example:9443/bundles/x.tgz"
    )
    assert model.content_url("", "x") == ""


def test_a_configmap_in_use_is_not_deleted_and_others_are() -> None:
    def users(name: str) -> list[str]:
        return ['bundle "b1"', 'bundledeployment "d1"'] if name == "used" else []

    used = {"metadata": {"name": "used"}}
    assert webhook.configmap_denial("DELETE", used, users) == (
        'configmap "used" is in use by bundle "b1" (and 1 more)'
    )
    assert webhook.configmap_denial("DELETE", {"metadata": {"name": "free"}}, users) == ""
    assert webhook.configmap_denial("UPDATE", used, users) == ""


def test_a_review_admits_when_the_users_cannot_be_read() -> None:
    def broken(name: str) -> list[str]:
        from rukpak.common import errors

        raise errors.Unavailable("API server unreachable")

    body = {
        "request": {"uid": "u", "operation": "DELETE", "oldObject": {"metadata": {"name": "x"}}}
    }
    assert webhook.configmap_review(body, broken)["response"] == {"uid": "u", "allowed": True}
