"""Pre-staging: the words the manager and the node plugins exchange (pure rules), and the
node's core (``csi.node.prestage.Prestager``) on a real image cache and a real registry.

The cluster side (the manager's gate holding a pivot, the plugin's watch answering on its
Node) is in ``test_prestage_cluster``; the three-node rollout in
``test_multinode_prestage``.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path

import pytest

from csi.node.prestage import Prestager
from rukpak.common import prestage as words
from rukpak.image.cache import ImageCache
from rukpak.image.cachestate import Holder
from rukpak.image.seams import PullPolicy
from rukpak.oci.auth import Credentials
from rukpak.oci.client import RegistryClient
from rukpak.oci.manifest import Platform
from tests.csi_helpers import PushedImage, dockerconfig, push_image, simple_image
from tests.registry import RegistryServer

D1 = "sha256:" + "1" * 64
D2 = "sha256:" + "2" * 64
D3 = "sha256:" + "3" * 64
PLATFORM = Platform("linux", "amd64")


# --- the words --------------------------------------------------------------------------


def test_a_cached_label_fits_the_label_key_limits() -> None:
    key = words.cached_label(D1)
    prefix, _, name = key.partition("/")
    assert prefix == "cached.csi.rukpak.io"
    assert len(name) == 63 and name == "1" * 63


@pytest.mark.parametrize("bad", ["", "sha256:abc", "md5:" + "1" * 64, "sha256:" + "G" * 64])
def test_a_cached_label_refuses_what_is_not_a_digest(bad: str) -> None:
    with pytest.raises(ValueError, match="not a sha256 digest"):
        words.cached_label(bad)


def test_the_advert_keeps_the_newest_digests_and_evicts_the_oldest() -> None:
    labels = {words.cached_label(D3): "true", "kubernetes.io/hostname": "n1"}
    patch = words.advert_patch(labels, [D1, D2, D3], limit=2)
    assert patch == {
        words.cached_label(D1): "true",
        words.cached_label(D2): "true",
        words.cached_label(D3): None,
    }
    assert "kubernetes.io/hostname" not in patch  # other labels are never touched


def test_the_advert_writes_nothing_when_it_is_right() -> None:
    labels = {words.cached_label(D1): "true"}
    assert words.advert_patch(labels, [D1], limit=4) == {}


@pytest.mark.parametrize(
    "text",
    [
        None,
        "",
        "not json",
        "[]",
        '{"images": "x"}',
        '{"images": ["registry.example/app:v1"]}',  # a tag: not pinned
        '{"images": ["registry.example/app:v1@' + D1 + '"]}',  # tag and digest: refused
        '{"images": [42, null]}',
    ],
)
def test_a_broken_ask_asks_nothing(text: str | None) -> None:
    assert words.parse_request(text) == []


def test_an_ask_names_at_most_max_images() -> None:
    images = [f"registry.example/app{i}@{D1}" for i in range(40)]
    assert len(words.parse_request(words.request_value(images, "t"))) == words.MAX_IMAGES


def test_answers_keep_the_newest_and_survive_a_round_trip() -> None:
    states = {
        f"sha256:{i:064x}": words.Answer(words.CACHED, at=float(i), asked="a")
        for i in range(words.MAX_STATES + 10)
    }
    kept = words.parse_states(words.dump_states(states))
    assert len(kept) == words.MAX_STATES
    assert min(a.at for a in kept.values()) == 10.0
    assert kept[f"sha256:{41:064x}"] == states[f"sha256:{41:064x}"]


def test_broken_answers_are_left_out() -> None:
    text = json.dumps({D1: {"state": "nonsense"}, "x": {"state": "cached"}, D2: "cached"})
    assert words.parse_states(text) == {}
    assert words.parse_states("{not json") == {}


def node(
    name: str, answers: dict[str, words.Answer] | None, *, enabled: bool = True
) -> words.NodeView:
    labels = {words.ENABLED_LABEL: "true"} if enabled else {}
    notes = {words.STATE_ANNOTATION: words.dump_states(answers)} if answers is not None else {}
    return words.NodeView(name, labels, notes)


def test_the_pivot_waits_for_a_node_that_has_not_answered() -> None:
    verdict = words.judge(
        [node("a", {D1: words.Answer(words.CACHED)}), node("b", None)], [D1], asked="t1"
    )
    assert not verdict.ready
    assert verdict.waiting == ("b",)
    assert "no answer yet from b" in verdict.summary()


def test_the_pivot_waits_for_a_fetch_and_tells_how_far_it_is() -> None:
    fetching = words.Answer(words.FETCHING, bytes=50 * 2**20, total=100 * 2**20, asked="t1")
    verdict = words.judge([node("a", {D1: fetching})], [D1], asked="t1")
    assert not verdict.ready
    assert "a fetching sha256:111111111111 50/100 MiB" in verdict.summary()


def test_a_skip_counts_only_for_this_ask() -> None:
    old = {D1: words.Answer(words.SKIPPED, asked="t0")}
    assert not words.judge([node("a", old)], [D1], asked="t1").ready
    now = {D1: words.Answer(words.SKIPPED, asked="t1")}
    assert words.judge([node("a", now)], [D1], asked="t1").ready


def test_a_failed_node_does_not_hold_the_pivot_and_is_named() -> None:
    failed = {D1: words.Answer(words.FAILED, message="401 Unauthorized", asked="t1")}
    cached = {D1: words.Answer(words.CACHED, asked="t0")}
    verdict = words.judge([node("a", failed), node("b", cached)], [D1], asked="t1")
    assert verdict.ready
    assert verdict.failed == ("a: 401 Unauthorized",)
    assert verdict.cached == ("b",)


def test_nodes_that_do_not_follow_asks_are_not_waited_for() -> None:
    assert words.judge([node("a", None, enabled=False)], [D1], asked="t1").ready


def test_every_asked_image_must_be_answered() -> None:
    answers = {D1: words.Answer(words.CACHED)}
    assert not words.judge([node("a", answers)], [D1, D2], asked="t1").ready


# --- the node's core, on a real cache and registry ---------------------------------------


pytest_registry = pytest.mark.registry


def big_image(registry: RegistryServer, repo: str, tag: str, size: int) -> PushedImage:
    """An image of one layer holding ``size`` bytes of incompressible data (plus a name)."""
    data = os.urandom(size)
    return push_image(registry.host, repo, tag, [[("data.bin", "file", data)]])


@pytest.fixture(name="images")
def _images(tmp_path: Path) -> ImageCache:
    """A real image cache under ``tmp_path`` (pulls without retries)."""
    return ImageCache(
        tmp_path / "images",
        puller_factory=lambda creds: RegistryClient(credentials=creds, retries=0),
        durable=False,
    )


def stager(images: ImageCache, **kw: object) -> Prestager:
    return Prestager(
        images=images,
        puller_factory=lambda creds: RegistryClient(credentials=creds, retries=0),
        platform=PLATFORM,
        interval=0.05,
        **kw,  # type: ignore[arg-type]
    )


def pinned(image: PushedImage) -> str:
    return f"{image.ref.rsplit(':', 1)[0]}@{image.manifest_digest}"


def held(
    registry: RegistryServer, images: ImageCache, repo: str, *, text: str = "hello"
) -> PushedImage:
    """``repo``:v1 pushed and left in ``images`` as its publish on a volume of this node
    leaves it (the volume holds it)."""
    image = simple_image(registry.host, repo, "v1", text=text)
    images.ensure(
        pinned(image),
        platform=PLATFORM,
        pull_policy=PullPolicy.IF_NOT_PRESENT,
        holder=Holder(target="/pods/a/volumes/bundle", volume_id="v", image=image.ref),
    )
    return image


@pytest_registry
def test_a_node_holding_the_repository_fetches_the_new_digest_and_reports_progress(
    registry: RegistryServer, images: ImageCache
) -> None:
    held(registry, images, "prestage/app")
    new = big_image(registry, "prestage/app", "v2", 8 * 2**20)
    reports: list[words.Answer] = []
    answer = stager(images).stage(pinned(new), asked="t1", report=reports.append)
    assert answer.state == words.CACHED and answer.asked == "t1"
    assert answer.total > 8 * 2**20 and answer.bytes == answer.total
    assert images.has_tree(new.manifest_digest)
    assert reports and all(r.state == words.FETCHING and r.total == answer.total for r in reports)
    assert [r.bytes for r in reports] == sorted(r.bytes for r in reports)  # never backwards
    # only cached: nothing holds it until a publish does
    assert new.manifest_digest not in {images.holder_digest(t) for t in images.holders()}


@pytest_registry
def test_a_node_without_the_repository_skips_and_fetches_nothing(
    registry: RegistryServer, images: ImageCache
) -> None:
    held(registry, images, "prestage/other")
    new = simple_image(registry.host, "prestage/skipped", "v2", text="skipped")
    answer = stager(images).stage(pinned(new), asked="t1")
    assert answer.state == words.SKIPPED
    assert "no volume of" in answer.message
    assert not images.has_tree(new.manifest_digest)


@pytest_registry
def test_a_node_serving_a_store_volume_fetches_for_its_standing_provisioner(
    registry: RegistryServer, images: ImageCache
) -> None:
    new = simple_image(registry.host, "prestage/standing", "v2", text="standing")
    answer = stager(images, store_present=lambda: True).stage(pinned(new), asked="t1")
    assert answer.state == words.CACHED
    assert "store volume" in answer.message
    assert images.has_tree(new.manifest_digest)


@pytest_registry
def test_a_digest_already_cached_is_answered_at_once_and_advertised(
    registry: RegistryServer, images: ImageCache
) -> None:
    old = held(registry, images, "prestage/held", text="held")
    core = stager(images)
    answer = core.stage(pinned(old), asked="t1")
    assert answer.state == words.CACHED and answer.message == "already cached"
    assert core.cached_newest_first() == [old.manifest_digest]


@pytest_registry
def test_a_private_image_is_never_fetched_with_someones_credential(
    auth_registry: RegistryServer, images: ImageCache
) -> None:
    assert auth_registry.username and auth_registry.password
    secret = dockerconfig(auth_registry.host, auth_registry.username, auth_registry.password)
    creds = Credentials.from_dockerconfigjson(secret[".dockerconfigjson"])
    old = push_image(
        auth_registry.host, "prestage/private", "v1", [[("a", "file", b"1")]], credentials=creds
    )
    new = push_image(
        auth_registry.host, "prestage/private", "v2", [[("a", "file", b"2")]], credentials=creds
    )
    images.ensure(
        pinned(old),
        platform=PLATFORM,
        pull_policy=PullPolicy.IF_NOT_PRESENT,
        credentials=creds,
        holder=Holder(target="/pods/a/volumes/p", volume_id="v", image=old.ref),
    )
    answer = stager(images).stage(pinned(new), asked="t1")
    assert answer.state == words.FAILED
    assert answer.message
    assert not images.has_tree(new.manifest_digest)


@pytest_registry
def test_an_unknown_digest_fails_with_the_registrys_words(
    registry: RegistryServer, images: ImageCache
) -> None:
    held(registry, images, "prestage/gone")
    missing = f"{registry.host}/prestage/gone@sha256:{'0' * 64}"
    answer = stager(images).stage(missing, asked="t1")
    assert answer.state == words.FAILED and answer.message


def test_an_ask_that_is_not_pinned_fails_without_a_request(tmp_path: Path) -> None:
    images = ImageCache(tmp_path / "images", puller_factory=_no_registry, durable=False)
    answer = stager(images).stage("registry.example/app:v1", asked="t1")
    assert answer.state == words.FAILED and "not pinned" in answer.message


def _no_registry(_: Credentials | None) -> RegistryClient:
    raise AssertionError("no registry request expected")


@pytest_registry
def test_two_asks_of_one_digest_fetch_it_once(registry: RegistryServer, images: ImageCache) -> None:
    held(registry, images, "prestage/twice")
    new = big_image(registry, "prestage/twice", "v2", 2 * 2**20)
    core = stager(images)
    answers: list[words.Answer] = []
    threads = [
        threading.Thread(target=lambda: answers.append(core.stage(pinned(new), asked="t1")))
        for _ in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(a.state for a in answers) == [words.CACHED, words.CACHED]
    assert images.has_tree(new.manifest_digest)


# --- the manager's reading of a BundleDeployment ------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, 30.0), ("0", 0.0), ("300", 300.0), ("1.5", 1.5), ("-1", 30.0), ("1e9", 30.0),
     ("soon", 30.0), ("nan", 30.0)],
)  # fmt: skip
def test_a_bundledeployments_own_timeout_overrides_the_flag_when_it_is_sane(
    value: str | None, expected: float
) -> None:
    from provisioner.manager.acting import prestage as gate

    notes = {} if value is None else {words.TIMEOUT_ANNOTATION: value}
    assert gate.timeout_of({"metadata": {"annotations": notes}}, 30.0) == expected


def test_an_ask_round_trips_with_its_generation() -> None:
    from provisioner.manager.acting import prestage as gate

    image = f"registry.example/app@{D1}"
    value = gate.ask_value([image], 7, "2026-01-01T00:00:00.000Z")
    bd = {"metadata": {"annotations": {words.REQUEST_ANNOTATION: value}}}
    assert gate.ask_of(bd) == ([image], 7, "2026-01-01T00:00:00.000Z")
    assert gate.ask_of({"metadata": {}}) == ([], None, "")


def test_a_plugin_told_to_follow_asks_without_credentials_refuses_to_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    from csi.plugin import main as plugin

    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT"):
        monkeypatch.delenv(name, raising=False)
    argv = [
        f"--endpoint=unix://{tmp_path}/csi.sock",
        f"--state-dir={tmp_path}/state",
        f"--kubelet-dir={tmp_path}/kubelet",
        "--no-controller",
        "--prestage=follow",
    ]
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        assert plugin.main(argv) == 1
    finally:  # the plugin configured the process's logging: give pytest its own back
        root.handlers[:], root.level = handlers, level
    said = capfd.readouterr().err  # the plugin configures its own logging (stderr)
    assert "--prestage=follow needs in-cluster credentials or $KUBECONFIG" in said
    assert not (tmp_path / "csi.sock").exists()
