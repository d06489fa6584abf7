"""The planner of v1alpha2 BundleDeployments (``provisioner.manager.planning.inline``),
pure: what it pins and when, what it refuses before fetching, the instance run it builds for
one and for
several sources, and the conditions it reports. The same flows on the local kubelet are in
``test_e2e_v1alpha2``."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from provisioner.engine.bundle import words
from provisioner.engine.objects import Obj, ObjectRef
from provisioner.manager import model, resolution
from provisioner.manager.planning import generate, inline, plan, runs, sources
from rukpak.common import errors
from tests.plan_helpers import bd_v2, kinds

DIGEST = "sha256:" + "a" * 64
SETTINGS = model.Settings(image="registry.example/rukpak:1", system_namespace="rukpak-system")
NOW = "2026-11-25T12:00:00Z"


def bd(*, generation: int = 1, pin: tuple[int, str] | None = None, **spec: Any) -> Obj:
    return bd_v2(generation=generation, pin=pin, digest=f"registry.example/hello@{DIGEST}", **spec)


def planned(the_bd: Obj, observed: plan.Observed | None = None) -> list[plan.Action]:
    return inline.plan_inline(the_bd, observed or plan.Observed(now=NOW), settings=SETTINGS)


def written(actions: list[plan.Action]) -> dict[str, Obj]:
    for action in actions:
        if isinstance(action, plan.WriteStatus):
            return {c["type"]: c for c in action.status["conditions"]}
    return {}


def test_an_unpinned_source_is_resolved_first_and_nothing_else_happens() -> None:
    actions = planned(bd())
    assert kinds(actions) == ["ResolveSource"]
    resolve = actions[0]
    assert isinstance(resolve, plan.ResolveSource)
    assert resolve.sources == (("", bd()["spec"]["source"]),)
    assert resolve.generation == 1


def test_a_pin_holds_until_the_generation_changes() -> None:
    assert "ResolveSource" not in kinds(planned(bd(pin=(1, NOW))))
    assert kinds(planned(bd(generation=2, pin=(1, NOW)))) == ["ResolveSource"]


def test_poll_interval_re_pins_once_it_passed_and_requeues_until_then() -> None:
    fresh = planned(bd(pin=(1, "2026-11-25T11:59:00Z"), pollInterval="2m"))
    requeue = [a for a in fresh if isinstance(a, plan.Requeue)]
    assert requeue and requeue[0].after == pytest.approx(60.0)
    stale = planned(bd(pin=(1, "2026-11-25T11:57:00Z"), pollInterval="2m"))
    assert kinds(stale) == ["ResolveSource"]


def test_a_pinned_source_starts_an_instance_run_that_mounts_the_digest() -> None:
    actions = planned(bd(pin=(1, NOW)))
    runs_made = [a for a in actions if isinstance(a, plan.CreatePod)]
    assert len(runs_made) == 1
    pod = runs_made[0].pod
    attributes = pod["spec"]["volumes"][0]["csi"]["volumeAttributes"]
    assert attributes["image"] == f"registry.example/hello@{DIGEST}"
    annotation = pod["metadata"]["annotations"][model.BUNDLE_ANNOTATION]
    assert annotation.startswith("hello-")
    conds = written(actions)
    assert conds["Unpacked"]["reason"] == "Unpacking"
    assert conds["Installed"]["reason"] == "InstallPending"
    assert "CreateBundle" not in kinds(actions)


def test_format_alone_picks_the_loader() -> None:
    pod = next(
        a.pod
        for a in planned(bd(pin=(1, NOW), provisionerClassName=None, format="registry-v1"))
        if isinstance(a, plan.CreatePod)
    )
    command = pod["spec"]["containers"][0]["command"]
    assert command[command.index("--format") + 1] == "registry+v1"


def test_the_recorded_install_makes_it_unpacked_and_installed() -> None:
    the_bd = bd(pin=(1, NOW))
    run = next(a.pod for a in planned(the_bd) if isinstance(a, plan.CreatePod))
    record = runs.InstallRecord(
        by=model.name_of(run), bundle=run["metadata"]["annotations"][model.BUNDLE_ANNOTATION]
    )
    conds = written(planned(the_bd, plan.Observed(record=record, now=NOW)))
    assert conds["Unpacked"]["status"] == "True"
    assert conds["Installed"]["message"] == f"Instantiated bundle {record.bundle} successfully"


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            {"requireImmutableRefs": True},
            'requireImmutableRefs is set: image reference "registry.example/hello:v1" is a tag',
        ),
        (
            {
                "requireImmutableRefs": True,
                "source": {"type": "git", "git": {"repository": "r", "ref": {"branch": "main"}}},
            },
            'git branch "main" can move',
        ),
        (
            {
                "requireImmutableRefs": True,
                "source": {"type": "http", "http": {"url": "https://h.example/b.tgz"}},
            },
            "names no content digest",
        ),
        ({"source": {"type": "upload", "upload": {}}}, 'bundle source type "upload" not supported'),
        (
            {
                "source": None,
                "sources": [
                    {"type": "image", "image": {"ref": "a"}, "destination": "a"},
                    {"type": "image", "image": {"ref": "b"}, "destination": "a/b"},
                ],
            },
            "overlap",
        ),
        (
            {
                "source": None,
                "sources": [{"type": "image", "image": {"ref": "a"}, "destination": "."}],
            },
            "must name a directory below the bundle root",
        ),
    ],
    ids=["image tag", "git branch", "http without digest", "upload", "nested", "root"],
)
def test_what_cannot_be_installed_is_refused_before_fetching(spec: Obj, expected: str) -> None:
    actions = planned(bd(**spec))
    assert "ResolveSource" not in kinds(actions)
    conds = written(actions)
    assert conds["Unpacked"]["reason"] == "UnpackFailed"
    assert expected in conds["Unpacked"]["message"]


def test_immutable_refs_pass_with_a_digest_and_a_commit() -> None:
    assert inline.mutable_ref({"type": "image", "image": {"ref": f"r/a@{DIGEST}"}}) is None
    commit = {"type": "git", "git": {"repository": "r", "ref": {"commit": "c" * 40}}}
    assert inline.mutable_ref(commit) is None


def test_paused_only_pins_and_previews_and_another_class_is_left_alone() -> None:
    assert kinds(planned(bd(paused=True))) == ["ResolveSource"]
    previewed = planned(bd(paused=True, pin=(1, NOW)))
    (run,) = [a for a in previewed if isinstance(a, plan.CreatePod)]
    assert "--preview" in run.pod["spec"]["containers"][0]["command"]
    other = bd(provisionerClassName="core-rukpak-io-helm")
    other["metadata"]["finalizers"] = []
    assert planned(other) == []


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90s", 90.0), ("10m", 600.0), ("1h30m", 5400.0), ("500ms", 0.5), ("", None), ("soon", None)],
)
def test_poll_intervals_read_as_go_durations(text: str, seconds: float | None) -> None:
    assert inline.seconds_of(text) == seconds


def test_several_sources_mount_each_at_its_destination() -> None:
    several = sources.several(
        [
            ("app", sources.pinned_image(f"r/app@{DIGEST}")),
            ("config", sources.pinned_image(f"r/config@{DIGEST}")),
        ]
    )
    the_bd = bd(source=None, sources=[])
    pod = generate.instance_run_pod(the_bd, "hello-x", several, SETTINGS, 0)
    spec = pod["spec"]
    assert [v["name"] for v in spec["volumes"]] == ["bundle", "source-0", "source-1"]
    assert "emptyDir" in spec["volumes"][0]
    mounts = spec["containers"][0]["volumeMounts"]
    assert [m["mountPath"] for m in mounts] == ["/bundle", "/bundle/app", "/bundle/config"]
    command = spec["containers"][0]["command"]
    assert command.count("--source-dir") == 2 and "/bundle/config" in command


def test_one_source_keeps_the_pod_of_the_previous_release() -> None:
    """The run pod of one source is what it was (a new shape would start a new revision)."""
    pinned = sources.pinned_image(f"r/app@{DIGEST}")
    pod = generate.instance_run_pod(bd(), "hello-x", pinned, SETTINGS, 0)
    assert pod["spec"]["volumes"] == [sources.volume(pinned)]
    assert pod["spec"]["containers"][0]["volumeMounts"] == [
        {"name": "bundle", "mountPath": "/bundle", "readOnly": True}
    ]
    assert "--source-dir" not in pod["spec"]["containers"][0]["command"]


def test_a_configmaps_volume_is_named_as_asked_whatever_its_configmaps_are_called() -> None:
    pinned = {
        "type": "configMaps",
        "configMaps": [{"configMap": {"name": "a"}}, {"configMap": {"name": "b"}}],
        sources.ITEMS_KEY: [
            ["a", "x.yaml", "manifests/x.yaml"],
            ["b", "y.yaml", "manifests/y.yaml"],
        ],
    }
    assert sources.volume(pinned)["name"] == "bundle"
    volume = sources.volume(pinned, name="source-1")
    assert volume["name"] == "source-1"
    assert [s["configMap"]["name"] for s in volume["projected"]["sources"]] == ["a", "b"]


def test_a_pull_secret_rides_with_the_pin_and_the_volume_presents_it() -> None:
    pinned = sources.pinned_image("r/x@sha256:" + "1" * 64, pull_secret="login")
    assert pinned == {
        "type": "image",
        "image": {"ref": "r/x@sha256:" + "1" * 64, "pullSecret": "login"},
    }
    volume = sources.volume(pinned)
    assert volume["csi"]["nodePublishSecretRef"] == {"name": "login"}
    assert (
        "nodePublishSecretRef"
        not in sources.volume(sources.pinned_image("r/x@sha256:" + "1" * 64))["csi"]
    )


class _Secrets:
    """``Kube.get`` of Secrets only."""

    def __init__(self, **secrets: Obj) -> None:
        self.secrets = secrets

    def get(self, ref: ObjectRef) -> Obj | None:
        return self.secrets.get(ref.name)


@pytest.mark.parametrize(
    ("secret", "says"),
    [
        (None, "pull secret rukpak-system/login not found: create it in the system namespace"),
        ({"data": {"token": "eA=="}}, "has no readable '.dockerconfigjson' key"),
        ({"data": {".dockerconfigjson": "not base64!"}}, "has no readable '.dockerconfigjson' key"),
        ({"data": {".dockerconfigjson": base64.b64encode(b"[1]").decode()}}, "pull secret"),
    ],
)
def test_a_pull_secret_that_is_missing_or_broken_says_what_to_do(
    secret: Obj | None, says: str
) -> None:
    kube = _Secrets(**({"login": secret} if secret is not None else {}))
    with pytest.raises(errors.RukpakError) as caught:
        resolution.pull_credentials(kube, "login", "rukpak-system")  # type: ignore[arg-type]
    assert says in caught.value.message
    assert caught.value.code in ("NOT_FOUND", "INVALID_ARGUMENT")


def test_a_readable_pull_secret_gives_its_login() -> None:
    config = {"auths": {"r.example": {"auth": base64.b64encode(b"me:pw").decode()}}}
    data = {".dockerconfigjson": base64.b64encode(json.dumps(config).encode()).decode()}
    creds = resolution.pull_credentials(_Secrets(login={"data": data}), "login", "ns")  # type: ignore[arg-type]
    login = creds.for_host("r.example")
    assert (
        login is not None and login.basic_header() == "Basic " + base64.b64encode(b"me:pw").decode()
    )


def _failed_run(the_bd: Obj, message: str) -> Obj:
    """The first run of ``the_bd``'s pinned content, Failed with ``message``."""
    pod = next(a.pod for a in planned(the_bd) if isinstance(a, plan.CreatePod))
    state = {"terminated": {"exitCode": 1, "message": message, "finishedAt": NOW}}
    pod["status"] = {"phase": "Failed", "containerStatuses": [{"name": "instance", "state": state}]}
    return pod


@pytest.mark.parametrize(
    "failure",
    [
        words.MISSING_MANIFESTS,
        words.ZERO_OBJECTS,
        words.subdirectory("manifests/emptydir"),
        'get objects from bundle manifests: unable to decode "manifests/.gitignore": json: '
        "cannot unmarshal string into Go value of type map[string]interface {} (document 1, "
        "line 1: expected an object)",
    ],
    ids=["no manifests", "empty manifests", "a subdirectory", "a .gitignore"],
)
def test_a_bundle_the_run_refuses_is_install_failed_in_upstreams_words(failure: str) -> None:
    """Upstream v0.24's suite: Installed False, InstallFailed, its words in the message."""
    the_bd = bd(pin=(1, NOW))
    conds = written(planned(the_bd, plan.Observed(pods=(_failed_run(the_bd, failure),), now=NOW)))
    installed = conds["Installed"]
    assert (installed["status"], installed["reason"]) == ("False", "InstallFailed")
    assert failure in installed["message"]
    for upstream in (
        "readdir manifests: file does not exist",
        "found zero objects: plain+v0 bundles are required to contain at least one object",
        'subdirectories are not allowed within the "manifests" directory of the bundle image '
        'filesystem: found "manifests/emptydir"',
        "json: cannot unmarshal string into Go value",
    ):
        if upstream in failure:
            assert upstream in installed["message"]
    healthy = conds["Healthy"]
    assert (healthy["status"], healthy["reason"], healthy["message"]) == (
        "False",
        "InstallationStatusFalse",
        "Installed condition is false",
    )


def test_kinds_nobody_serves_read_as_v0_24_reports_them() -> None:
    """A v1alpha2 BundleDeployment whose CRD's provider does not exist: upstream v0.24's
    reason ErrorGettingReleaseState (a v1alpha1 one keeps v0.16's InstallFailed)."""
    the_bd = bd(pin=(1, NOW))
    failure = words.unknown_kinds({("x.io/v1", "Widget"): "manifests/w.yaml document 1 (line 1)"})
    conds = written(planned(the_bd, plan.Observed(pods=(_failed_run(the_bd, failure),), now=NOW)))
    installed = conds["Installed"]
    assert (installed["status"], installed["reason"]) == ("False", "ErrorGettingReleaseState")
    assert "ensure CRDs are installed first" in installed["message"]
    assert 'no matches for kind "Widget" in version "x.io/v1"' in installed["message"]
    assert conds["Healthy"]["reason"] == "InstallationStatusFalse"
    events = [a for a in planned(the_bd, plan.Observed(pods=(_failed_run(the_bd, failure),)))]
    warned = [a.reason for a in events if isinstance(a, plan.RecordEvent) and a.type == "Warning"]
    assert "ErrorGettingReleaseState" in warned
