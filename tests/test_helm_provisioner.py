"""The helm provisioner (contrib/helm-provisioner, class core-rukpak-io-helm) and the public
API it is built on (``provisioner.api``).

Three layers, cheapest first:

- pure planning (``rukpak_helm.plan``) and chart handling (``rukpak_helm.chart``: finding
  the chart, reading ``spec.config.values``, splitting helm's output), no helm;
- the real ``helm`` binary (``hack/helm.sh``: built from its Go module, cached) rendering
  and validating charts, and ``api.fetch_bundle`` against the real registry;
- end to end on the local kubelet: RukPak installed from ``deploy/`` (``rukpak_system``),
  the helm provisioner from its own manifests and image (``hack/build-image.sh``: the
  RukPak image plus one layer). A chart installs with the BundleDeployment's values, a
  values change re-renders and prunes, a drifted object comes back, a broken chart keeps
  the previous install with ``Installed=False`` and an event saying why, and deleting the
  BundleDeployment uninstalls.
"""

from __future__ import annotations

import ast
import hashlib
import os
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from rukpak_helm import chart, content, inline, plan

from provisioner import api
from tests import csi_helpers, source_servers
from tests import install_helpers as inst
from tests.polling import eventually

REPO = Path(__file__).resolve().parent.parent
CONTRIB = REPO / "contrib" / "helm-provisioner"
HELM_SH = REPO / "hack" / "helm.sh"
NOW = "2026-01-01T00:00:00Z"


# -- charts used below -------------------------------------------------------------------

CHART_YAML = "apiVersion: v2\nname: greeter\nversion: 0.1.0\n"
VALUES_YAML = "greeting: hello\nextra: false\nimage: busybox\n"


def configmap_template(suffix: str, key: str, value: str) -> str:
    """A chart template: the ConfigMap ``<release>-<suffix>`` holding ``key``: ``value`` (a
    template expression, quoted)."""
    return (
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n"
        f"  name: {{{{ .Release.Name }}}}-{suffix}\n"
        f"data:\n  {key}: {{{{ {value} | quote }}}}\n"
    )


CONFIGMAP_TPL = configmap_template("greeting", "greeting", ".Values.greeting")
EXTRA_TPL = """\
{{- if .Values.extra }}
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-extra
data:
  extra: "yes"
{{- end }}
"""
DEPLOYMENT_TPL = """\
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}-web
spec:
  replicas: 1
  selector:
    matchLabels: {app: {{ .Release.Name }}-web}
  template:
    metadata:
      labels: {app: {{ .Release.Name }}-web}
    spec:
      terminationGracePeriodSeconds: 1
      containers:
        - name: web
          image: {{ .Values.image }}
          command: [sh, -c, "trap 'exit 0' TERM; while true; do sleep 1; done"]
"""
BROKEN_TPL = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }-broken\n"


def chart_files(*, broken: bool = False, deployment: bool = False) -> dict[str, str]:
    files = {
        "Chart.yaml": CHART_YAML,
        "values.yaml": VALUES_YAML,
        "templates/configmap.yaml": CONFIGMAP_TPL,
        "templates/extra.yaml": EXTRA_TPL,
        "templates/NOTES.txt": "installed {{ .Release.Name }}\n",
    }
    if deployment:
        files["templates/deployment.yaml"] = DEPLOYMENT_TPL
    if broken:
        files["templates/broken.yaml"] = BROKEN_TPL
    return files


def write_chart(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def chart_entries(files: dict[str, str], *, under: str = "") -> list[csi_helpers.Entry]:
    """The chart as image layer entries (directories first), optionally under a directory."""
    prefix = f"{under}/" if under else ""
    dirs = sorted({str(Path(prefix + n).parent) for n in files} - {"."})
    entries: list[csi_helpers.Entry] = [(f"{d}/", "dir") for d in dirs]
    entries += [(prefix + n, "file", t.encode()) for n, t in sorted(files.items())]
    return entries


# -- pure: planning -----------------------------------------------------------------------


def bd(name: str = "greeter", **spec: Any) -> api.Obj:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "BundleDeployment",
        "metadata": {"name": name, "uid": "u-1", "generation": 3},
        "spec": {
            "provisionerClassName": plan.CLASS,
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "provisionerClassName": plan.CLASS,
                    "source": {"type": "image", "image": {"ref": "r.example/greeter:v1"}},
                },
            },
            **spec,
        },
    }


def with_finalizer(obj: api.Obj) -> api.Obj:
    obj["metadata"]["finalizers"] = [plan.FINALIZER]
    return obj


def owned_bundle(of: api.Obj, *, phase: str = "", pinned: str = "", message: str = "") -> api.Obj:
    out = api.desired_bundle(of)
    if phase:
        out["status"] = plan.bundle_status(
            phase=phase,  # type: ignore[arg-type]
            message=message,
            now=NOW,
            pinned=pinned,
        )
    return out


def kinds(actions: list[plan.Action]) -> list[str]:
    return [type(a).__name__ for a in actions]


PINNED = "r.example/greeter@sha256:" + "a" * 64


def test_only_objects_of_the_helm_class_are_handled() -> None:
    assert plan.handles(bd())
    other = bd()
    other["spec"]["provisionerClassName"] = "core-rukpak-io-plain"
    assert not plan.handles(other)
    assert not plan.handles({"spec": {}})


def test_a_new_bundle_deployment_gets_the_finalizer_and_the_core_s_bundle() -> None:
    decided = plan.plan(bd(), plan.Observed(now=NOW), default_namespace="default")
    assert kinds(decided.actions) == ["AddFinalizer", "CreateBundle"]
    created = decided.actions[1]
    assert isinstance(created, plan.CreateBundle)
    assert created.bundle == api.desired_bundle(bd())
    assert created.bundle["metadata"]["name"].startswith("greeter-")
    assert decided.valid is not None and decided.valid[:2] == ("True", "UnpackPending")


def bd_v2(name: str = "greeter", **spec: Any) -> api.Obj:
    """A BundleDeployment created as v1alpha2 (its v1alpha2 view): the chart image inline."""
    return {
        "apiVersion": "core.rukpak.io/v1alpha2",
        "kind": "BundleDeployment",
        "metadata": {"name": name, "uid": "u-2", "generation": 4},
        "spec": {
            "provisionerClassName": plan.CLASS,
            "installNamespace": name,
            "source": {"type": "image", "image": {"ref": "r.example/greeter:v1"}},
            **spec,
        },
    }


def pinned_v2(obj: api.Obj, *, generation: int = 4, ok: bool = True) -> api.Obj:
    """``obj`` with the status a pin for ``generation`` writes."""
    obj["metadata"]["finalizers"] = [plan.FINALIZER]
    reason = "UnpackSuccessful" if ok else "UnpackFailed"
    obj["status"] = {
        "resolvedSource": inline.resolved_status(PINNED),
        "conditions": [
            {"type": "Unpacked", "status": str(ok), "reason": reason,
             "message": "m", "observedGeneration": generation},
        ],
    }  # fmt: skip
    return obj


def test_a_v1alpha2_bundle_deployment_gets_the_finalizer_and_its_image_pinned_no_bundle() -> None:
    decided = inline.plan_inline(bd_v2(), plan.Observed(now=NOW), default_namespace="default")
    assert decided.actions == [plan.AddFinalizer(), plan.Resolve("r.example/greeter:v1")]
    assert decided.valid is not None and decided.valid[:2] == ("False", "UnpackPending")


def test_a_v1alpha2_pin_of_this_generation_is_installed_with_the_values() -> None:
    of = pinned_v2(bd_v2(config={"values": "greeting: hi\n"}))
    decided = inline.plan_inline(of, plan.Observed(now=NOW), default_namespace="default")
    (install,) = decided.actions
    assert isinstance(install, plan.Install)
    assert install.desired.pinned == PINNED
    assert install.desired.namespace == "greeter"
    assert install.desired.bundle == inline.revision_name(of, PINNED)
    assert install.desired.bundle.startswith("greeter-")
    done = plan.Outcome(install.desired.key, plan.succeeded(install.desired.bundle))
    again = inline.plan_inline(of, plan.Observed(last=done, now=NOW), default_namespace="x")
    assert again.actions == []  # installed already: not again until the values change
    of["spec"]["config"] = {"values": "greeting: bye\n"}
    changed = inline.plan_inline(of, plan.Observed(last=done, now=NOW), default_namespace="x")
    assert [type(a) for a in changed.actions] == [plan.Install]


def test_a_v1alpha2_pin_of_an_older_generation_is_resolved_again_not_on_a_resync() -> None:
    """A spec change (the values included) pins the tag again; the same generation never."""
    stale = pinned_v2(bd_v2(), generation=3)
    decided = inline.plan_inline(stale, plan.Observed(now=NOW), default_namespace="default")
    assert decided.actions == [plan.Resolve("r.example/greeter:v1")]
    assert inline.pin_of(stale) is None
    assert inline.pin_of(pinned_v2(bd_v2())) == PINNED


def test_a_v1alpha2_pin_without_a_valid_chart_installs_nothing() -> None:
    bad = pinned_v2(bd_v2(), ok=False)
    decided = inline.plan_inline(bad, plan.Observed(now=NOW), default_namespace="default")
    assert decided.actions == []
    assert decided.valid == ("False", "UnpackFailed", "m")


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ({"source": {"type": "git", "git": {"repository": "https://x/y"}}},
         'source bundle content: bundle source type "git" not supported by core-rukpak-io-helm'),
        ({"sources": [{"type": "image", "image": {"ref": "r/x:1"}, "destination": "a"}]},
         "source bundle content: spec.sources is not supported"),
        ({"requireImmutableRefs": True},
         'spec.requireImmutableRefs is set: image reference "r.example/greeter:v1" is a tag'),
    ],
)  # fmt: skip
def test_a_v1alpha2_source_the_helm_provisioner_cannot_install_is_refused(
    spec: api.Obj, says: str
) -> None:
    decided = inline.plan_inline(bd_v2(**spec), plan.Observed(now=NOW), default_namespace="d")
    assert decided.actions == [plan.AddFinalizer()]
    assert decided.valid is not None and decided.valid[:2] == ("False", "UnpackFailed")
    assert says in decided.valid[2]


def test_a_v1alpha2_digest_is_accepted_under_require_immutable_refs() -> None:
    of = bd_v2(requireImmutableRefs=True, source={"type": "image", "image": {"ref": PINNED}})
    decided = inline.plan_inline(of, plan.Observed(now=NOW), default_namespace="d")
    assert decided.actions == [plan.AddFinalizer(), plan.Resolve(PINNED)]


HTTP_CHART = "http://127.0.0.1:8080/charts/greeter-0.1.0.tgz"


def test_a_v1alpha2_http_source_is_pinned_then_installed_from_its_url() -> None:
    """Upstream's own helm example names the chart's tarball by URL."""
    of = bd_v2(source={"type": "http", "http": {"url": HTTP_CHART}})
    decided = inline.plan_inline(of, plan.Observed(now=NOW), default_namespace="d")
    assert decided.actions == [plan.AddFinalizer(), plan.Resolve(HTTP_CHART)]
    pinned_url = HTTP_CHART + "#sha256=" + "b" * 64
    of["metadata"]["finalizers"] = [plan.FINALIZER]
    of["status"] = {
        "resolvedSource": inline.resolved_status(pinned_url),
        "conditions": [{"type": "Unpacked", "status": "True", "observedGeneration": 4}],
    }
    assert of["status"]["resolvedSource"] == {"type": "http", "http": {"url": pinned_url}}
    (install,) = inline.plan_inline(of, plan.Observed(now=NOW), default_namespace="d").actions
    assert isinstance(install, plan.Install) and install.desired.pinned == pinned_url


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ({"type": "http", "http": {"url": HTTP_CHART, "auth": {"secret": {"name": "s"}}}},
         "http sources with credentials are not supported"),
        ({"type": "configMaps", "configMaps": []}, 'bundle source type "configMaps" not supported'),
        ({"type": "image", "image": {}}, 'bundle source type "image" not supported'),
    ],
)  # fmt: skip
def test_a_v1alpha2_source_of_no_use_to_helm_is_refused(source: api.Obj, says: str) -> None:
    decided = inline.plan_inline(
        bd_v2(source=source), plan.Observed(now=NOW), default_namespace="d"
    )
    assert decided.valid is not None and decided.valid[:2] == ("False", "UnpackFailed")
    assert says in decided.valid[2]


def test_require_immutable_refs_wants_a_digest_in_an_http_url() -> None:
    loose = bd_v2(requireImmutableRefs=True, source={"type": "http", "http": {"url": HTTP_CHART}})
    refused = inline.plan_inline(loose, plan.Observed(now=NOW), default_namespace="d").valid
    assert refused is not None and "append #sha256=<hex of the tarball>" in refused[2]
    pinned = HTTP_CHART + "#sha256=" + "c" * 64
    tight = bd_v2(requireImmutableRefs=True, source={"type": "http", "http": {"url": pinned}})
    decided = inline.plan_inline(tight, plan.Observed(now=NOW), default_namespace="d")
    assert decided.actions == [plan.AddFinalizer(), plan.Resolve(pinned)]


def test_a_deleted_v1alpha2_bundle_deployment_uninstalls_with_its_policy() -> None:
    of = pinned_v2(bd_v2(deletionPolicy="Orphan"))
    of["metadata"]["deletionTimestamp"] = NOW
    decided = inline.plan_inline(of, plan.Observed(now=NOW), default_namespace="d")
    assert decided.actions == [plan.Uninstall("Orphan"), plan.RemoveFinalizer()]
    paused = bd_v2(paused=True)
    assert inline.plan_inline(paused, plan.Observed(now=NOW), default_namespace="d").actions == []


def test_the_status_carries_extra_fields_and_removes_those_set_to_none() -> None:
    of = pinned_v2(bd_v2())
    verdicts = {"Unpacked": ("True", "UnpackSuccessful", "m")}
    new, _ = plan.status(of, verdicts, active="", now=NOW, extra={"resolvedSource": None})
    assert new is not None and new["resolvedSource"] is None
    kept = {"resolvedSource": inline.resolved_status(PINNED)}
    of["status"]["observedGeneration"] = 4
    of["status"]["conditions"][0]["lastTransitionTime"] = NOW
    unchanged, events = plan.status(of, verdicts, active="", now=NOW, extra=kept)
    assert (unchanged, events) == (None, [])


def test_an_unpacked_bundle_is_rendered_and_installed_with_the_values() -> None:
    of = with_finalizer(bd(installNamespace="web", config={"values": "greeting: hi\n"}))
    observed = plan.Observed((owned_bundle(of, phase="Unpacked", pinned=PINNED),), None, NOW)
    decided = plan.plan(of, observed, default_namespace="default")
    (install,) = decided.actions
    assert isinstance(install, plan.Install)
    assert install.desired.pinned == PINNED
    assert install.desired.namespace == "web"
    assert install.desired.bundle == api.desired_bundle(of)["metadata"]["name"]
    assert decided.valid is not None and decided.valid[:2] == ("True", "UnpackSuccessful")


def test_what_was_installed_already_is_not_installed_again_until_the_values_change() -> None:
    of = with_finalizer(bd(config={"values": "greeting: hi\n"}))
    bundles = (owned_bundle(of, phase="Unpacked", pinned=PINNED),)
    first = plan.plan(of, plan.Observed(bundles, None, NOW), default_namespace="default")
    (install,) = first.actions
    assert isinstance(install, plan.Install)
    done = plan.Outcome(install.desired.key, plan.succeeded(install.desired.bundle))
    again = plan.plan(of, plan.Observed(bundles, done, NOW), default_namespace="default")
    assert again.actions == []
    of["spec"]["config"]["values"] = "greeting: bye\n"
    changed = plan.plan(of, plan.Observed(bundles, done, NOW), default_namespace="default")
    assert kinds(changed.actions) == ["Install"]


def test_a_failure_worth_retrying_is_installed_again_a_bad_chart_is_not() -> None:
    of = with_finalizer(bd())
    bundles = (owned_bundle(of, phase="Unpacked", pinned=PINNED),)
    first = plan.plan(of, plan.Observed(bundles, None, NOW), default_namespace="d")
    (install,) = first.actions
    assert isinstance(install, plan.Install)
    verdict = plan.failed(install.desired.bundle, "boom", kept="")
    busy = plan.Outcome(install.desired.key, verdict, final=False)
    bad = plan.Outcome(install.desired.key, verdict, final=True)
    observed = plan.Observed(bundles, busy, NOW)
    assert kinds(plan.plan(of, observed, default_namespace="d").actions) == ["Install"]
    assert plan.plan(of, plan.Observed(bundles, bad, NOW), default_namespace="d").actions == []


def test_a_failing_bundle_makes_has_valid_bundle_false_with_its_message() -> None:
    of = with_finalizer(bd())
    failing = owned_bundle(of, phase="Failing", message="no helm chart in the bundle")
    decided = plan.plan(of, plan.Observed((failing,), None, NOW), default_namespace="d")
    assert decided.actions == []
    assert decided.valid is not None
    status, reason, message = decided.valid
    assert (status, reason) == ("False", "UnpackFailed")
    assert message.endswith("Bundle: no helm chart in the bundle")


def test_a_template_of_another_class_is_refused() -> None:
    of = with_finalizer(bd())
    of["spec"]["template"]["spec"]["provisionerClassName"] = "core-rukpak-io-plain"
    decided = plan.plan(of, plan.Observed(now=NOW), default_namespace="d")
    assert decided.actions == []
    assert decided.valid is not None
    assert decided.valid[:2] == ("False", "UnsupportedProvisionerClass")


def test_bundles_neither_wanted_nor_active_are_deleted() -> None:
    of = with_finalizer(bd())
    of["status"] = {"activeBundle": "greeter-old"}
    old = {"metadata": {"name": "greeter-old"}}
    older = {"metadata": {"name": "greeter-older"}}
    wanted = owned_bundle(of)
    decided = plan.plan(of, plan.Observed((old, older, wanted), None, NOW), default_namespace="d")
    assert [a for a in decided.actions if isinstance(a, plan.DeleteBundle)] == [
        plan.DeleteBundle("greeter-older")
    ]


def test_deletion_uninstalls_with_the_policy_deletes_bundles_then_drops_the_finalizer() -> None:
    of = with_finalizer(bd(deletionPolicy="Orphan"))
    of["metadata"]["deletionTimestamp"] = NOW
    decided = plan.plan(of, plan.Observed((owned_bundle(of),), None, NOW), default_namespace="d")
    assert kinds(decided.actions) == ["Uninstall", "DeleteBundle", "RemoveFinalizer"]
    assert decided.actions[0] == plan.Uninstall("Orphan")
    assert decided.valid is None
    del of["metadata"]["finalizers"]
    assert plan.plan(of, plan.Observed(now=NOW), default_namespace="d").actions == []


def test_a_paused_bundle_deployment_is_left_alone() -> None:
    decided = plan.plan(bd(paused=True), plan.Observed(now=NOW), default_namespace="d")
    assert decided.actions == [] and decided.valid is None


def test_status_keeps_transition_times_and_records_an_event_per_transition() -> None:
    of = bd()
    valid = ("True", "UnpackSuccessful", "ok")
    new, events = plan.status(
        of, {plan.HAS_VALID_BUNDLE: valid, plan.INSTALLED: plan.succeeded("b1")}, active="b1",
        now=NOW,
    )  # fmt: skip
    assert new is not None
    assert new["activeBundle"] == "b1" and new["observedGeneration"] == 3
    assert [e.reason for e in events] == ["UnpackSuccessful", "InstallationSucceeded"]
    of["status"] = new
    same, none = plan.status(
        of, {plan.HAS_VALID_BUNDLE: valid, plan.INSTALLED: plan.succeeded("b1")}, active="b1",
        now="later",
    )  # fmt: skip
    assert same is None and none == []
    failed = plan.failed("b2", "helm template failed: parse error", kept="b1")
    later, events = plan.status(
        of, {plan.HAS_VALID_BUNDLE: valid, plan.INSTALLED: failed}, active="b1", now="later"
    )
    assert later is not None
    times = {c["type"]: c["lastTransitionTime"] for c in later["conditions"]}
    assert times == {plan.HAS_VALID_BUNDLE: NOW, plan.INSTALLED: "later"}
    (event,) = events
    assert (event.type, event.reason) == ("Warning", "InstallFailed")
    assert "b1 stays installed" in event.message


def test_installed_falls_back_to_what_the_status_says_after_a_restart() -> None:
    of = bd()
    assert plan.installed_verdict(of, None)[:2] == ("False", "InstallPending")
    of["status"] = {"conditions": [{"type": "Installed", "status": "True", "reason": "R"}]}
    assert plan.installed_verdict(of, None)[:2] == ("True", "R")


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ({"type": "image", "image": {"ref": "r/x:v1"}}, None),
        ({"type": "git", "git": {"repository": "https://x"}}, 'bundle source type "git" not'),
        ({"type": "image", "image": {}}, 'bundle source type "image" not'),
    ],
)
def test_only_image_sources_are_fetched(source: api.Obj, problem: str | None) -> None:
    found = plan.source_problem({"spec": {"source": source}})
    assert (found is None) if problem is None else (found is not None and problem in found)


def test_the_provisioner_imports_nothing_of_the_project_but_the_public_api() -> None:
    for path in sorted((CONTRIB / "rukpak_helm").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [
                    node.module + ("." + node.names[0].name if node.module == "provisioner" else "")
                ]
            for name in names:
                top = name.split(".")[0]
                if top in ("csi", "provisioner", "tests"):
                    assert name == "provisioner.api", f"{path.name} imports {name}"


# -- pure: charts and values --------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "values"),
    [
        (None, {}),
        ({}, {}),
        ({"values": ""}, {}),
        ({"values": "a: 1\nb: {c: x}\n"}, {"a": 1, "b": {"c": "x"}}),
        ({"values": "# only a comment\n"}, {}),
    ],
)
def test_values_come_from_the_config_values_string(config: Any, values: api.Obj) -> None:
    of = bd() if config is None else bd(config=config)
    assert chart.values_of(of) == values


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"values": {"a": 1}}, "must be a string holding YAML"),
        ({"values": "[1, 2]"}, "must hold a YAML map"),
        ({"values": "a: [1"}, "not valid YAML"),
    ],
)
def test_bad_values_say_what_is_wrong(config: api.Obj, says: str) -> None:
    with pytest.raises(chart.ChartError, match=says):
        chart.values_of(bd(config=config))


def test_the_chart_is_at_the_root_in_one_directory_or_one_archive(tmp_path: Path) -> None:
    root = write_chart(tmp_path / "a", {"Chart.yaml": CHART_YAML})
    assert chart.find_chart(root) == root
    nested = tmp_path / "b"
    write_chart(nested / "greeter", {"Chart.yaml": CHART_YAML})
    (nested / "README.md").parent.mkdir(exist_ok=True)
    (nested / "README.md").write_text("readme")
    assert chart.find_chart(nested) == nested / "greeter"
    archive = tmp_path / "c"
    archive.mkdir()
    (archive / "greeter-0.1.0.tgz").write_bytes(b"")
    assert chart.find_chart(archive) == archive / "greeter-0.1.0.tgz"


def test_no_chart_or_several_charts_are_refused_naming_what_is_there(tmp_path: Path) -> None:
    (tmp_path / "manifests").mkdir()
    with pytest.raises(chart.ChartError, match=r"no helm chart .*found: manifests"):
        chart.find_chart(tmp_path)
    write_chart(tmp_path / "one", {"Chart.yaml": CHART_YAML})
    write_chart(tmp_path / "two", {"Chart.yaml": CHART_YAML})
    with pytest.raises(chart.ChartError, match="several charts"):
        chart.find_chart(tmp_path)


def test_helm_output_splits_into_objects_that_remember_their_template() -> None:
    output = (
        "---\n# Source: greeter/templates/a.yaml\napiVersion: v1\nkind: ConfigMap\n"
        "metadata:\n  name: a\n---\n# Source: greeter/templates/b.yaml\napiVersion: v1\n"
        "kind: ConfigMap\nmetadata:\n  name: b\n---\napiVersion: v1\nkind: ConfigMap\n"
        "metadata:\n  name: b2\n---\n# Source: greeter/templates/empty.yaml\n"
    )
    bundle, templates = chart.split(output)
    assert bundle.format == chart.FORMAT
    assert [(m.obj["metadata"]["name"], m.source.file) for m in bundle.manifests] == [
        ("a", "greeter/templates/a.yaml"),
        ("b", "greeter/templates/b.yaml"),
        ("b2", "rendered.yaml"),
    ]
    assert templates == 3


def test_rendered_text_that_is_no_object_names_the_template() -> None:
    with pytest.raises(chart.ChartError, match=r"greeter/templates/x\.yaml"):
        chart.split("---\n# Source: greeter/templates/x.yaml\njust a string\n")
    with pytest.raises(chart.ChartError, match="rendered no objects"):
        chart.split("---\n# Source: greeter/templates/x.yaml\n")


# -- the real helm binary -----------------------------------------------------------------


@pytest.fixture(scope="session")
def helm() -> Path:
    """``helm`` built from its Go module by hack/helm.sh (cached; a cold build ~90 s)."""
    done = subprocess.run(
        ["bash", str(HELM_SH), "--quiet"], capture_output=True, text=True, timeout=900, check=False
    )
    if done.returncode != 0:
        pytest.fail(f"hack/helm.sh failed (it needs go, as make k8s-bins does):\n{done.stderr}")
    path = subprocess.run(
        ["bash", str(HELM_SH), "--print-path"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return Path(path)


def test_helm_renders_the_chart_with_the_values(helm: Path, tmp_path: Path) -> None:
    root = write_chart(tmp_path, chart_files())
    rendered = chart.render(
        helm, root, release="r1", namespace="ns1", values={"greeting": "hi", "extra": True}
    )
    objects = {m.obj["metadata"]["name"]: m for m in rendered.bundle.manifests}
    assert sorted(objects) == ["r1-extra", "r1-greeting"]
    assert objects["r1-greeting"].obj["data"] == {"greeting": "hi"}
    assert objects["r1-greeting"].source.file == "greeter/templates/configmap.yaml"
    defaults = chart.render(helm, root, release="r1", namespace="ns1", values={})
    assert [m.obj["metadata"]["name"] for m in defaults.bundle.manifests] == ["r1-greeting"]


def test_a_broken_template_fails_the_render_naming_it(helm: Path, tmp_path: Path) -> None:
    root = write_chart(tmp_path, chart_files(broken=True))
    with pytest.raises(chart.ChartError, match=r"helm template failed: .*broken\.yaml"):
        chart.render(helm, root, release="r1", namespace="ns1", values={})


def test_helm_checks_the_chart_metadata(helm: Path, tmp_path: Path) -> None:
    good = write_chart(tmp_path / "good", chart_files())
    assert chart.check(helm, good)["name"] == "greeter"
    bad = write_chart(tmp_path / "bad", {**chart_files(), "Chart.yaml": "apiVersion: v2\n"})
    with pytest.raises(chart.ChartError, match=r"helm show failed: .*name"):
        chart.check(helm, bad)


def test_a_missing_helm_binary_says_which_flag_to_pass(tmp_path: Path) -> None:
    with pytest.raises(chart.ChartError, match="pass --helm"):
        chart.check(tmp_path / "no-helm", tmp_path)


# -- api.fetch_bundle against the real registry ---------------------------------------------


@pytest.mark.registry
def test_fetch_bundle_pins_the_tag_and_writes_the_files(registry: Any, tmp_path: Path) -> None:
    repo = f"helm-{uuid.uuid4().hex[:6]}"
    pushed = csi_helpers.push_image(registry.host, repo, "v1", [chart_entries(chart_files())])
    pinned = api.fetch_bundle(pushed.ref, tmp_path / "c")
    assert pinned == f"{registry.host}/{repo}@{pushed.manifest_digest}"
    assert (tmp_path / "c" / "Chart.yaml").read_text() == CHART_YAML
    assert os.access(tmp_path / "c" / "templates", os.W_OK)
    again = api.fetch_bundle(pinned, tmp_path / "d")  # a pinned reference is fetched as is
    assert again == pinned
    with pytest.raises(FileExistsError):
        api.fetch_bundle(pinned, tmp_path / "d")


@pytest.mark.registry
def test_fetch_bundle_of_a_missing_tag_is_not_found_and_leaves_nothing(
    registry: Any, tmp_path: Path
) -> None:
    with pytest.raises(api.RukpakError) as caught:
        api.fetch_bundle(f"{registry.host}/nothing-here:v1", tmp_path / "c")
    assert caught.value.code == "NOT_FOUND"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.registry
def test_the_store_fetches_a_pinned_reference_once(registry: Any, tmp_path: Path) -> None:
    repo = f"helm-{uuid.uuid4().hex[:6]}"
    pushed = csi_helpers.push_image(registry.host, repo, "v1", [chart_entries(chart_files())])
    store = content.Store(tmp_path / "store")
    pinned, root = store.fetch(pushed.ref)
    assert (root / "Chart.yaml").is_file()
    (root / "marker").write_text("still the same directory")
    assert store.fetch(pinned) == (pinned, root)
    assert (root / "marker").exists()
    assert store.forget([]) == [root]
    assert not root.exists()


@pytest.fixture
def chart_server(tmp_path: Path) -> Iterator[source_servers.SourceServer]:
    """A real HTTP server on loopback serving ``/files/<name>``."""
    with source_servers.serving(tmp_path / "git") as server:
        yield server


def chart_tarball(files: dict[str, str], *, under: str = "greeter") -> bytes:
    """A chart as ``helm package`` lays it out: a tar.gz with the chart in one directory."""
    return source_servers.tarball({f"{under}/{name}": text for name, text in files.items()})


def test_fetch_tarball_pins_the_url_and_writes_the_files(
    chart_server: source_servers.SourceServer, tmp_path: Path
) -> None:
    body = chart_tarball(chart_files())
    chart_server.files["greeter-0.1.0.tgz"] = body
    url = f"{chart_server.url}/files/greeter-0.1.0.tgz"
    pinned = api.fetch_tarball(url, tmp_path / "c")
    assert pinned == f"{url}#sha256={hashlib.sha256(body).hexdigest()}"
    assert (tmp_path / "c" / "greeter" / "Chart.yaml").read_text() == CHART_YAML
    assert os.access(tmp_path / "c" / "greeter" / "templates", os.W_OK)
    assert api.fetch_tarball(pinned, tmp_path / "d") == pinned  # a pinned URL, as is
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left
    with pytest.raises(FileExistsError):
        api.fetch_tarball(pinned, tmp_path / "d")


def test_fetch_tarball_refuses_changed_bytes_a_hostile_path_and_a_missing_file(
    chart_server: source_servers.SourceServer, tmp_path: Path
) -> None:
    chart_server.files["chart.tgz"] = chart_tarball(chart_files())
    url = f"{chart_server.url}/files/chart.tgz"
    with pytest.raises(api.RukpakError) as changed:
        api.fetch_tarball(f"{url}#sha256={'0' * 64}", tmp_path / "a")
    assert changed.value.code == "FAILED_PRECONDITION"
    with pytest.raises(api.RukpakError) as missing:
        api.fetch_tarball(f"{chart_server.url}/files/nothing.tgz", tmp_path / "c")
    assert missing.value.code == "NOT_FOUND"
    assert list(tmp_path.iterdir()) == []  # nothing left behind
    # a hostile entry is dropped (and logged), as the node plugin drops it: nothing escapes
    evil = {"../escape.yaml": "x: 1\n", "greeter/Chart.yaml": CHART_YAML}
    chart_server.files["evil.tgz"] = source_servers.tarball(evil)
    api.fetch_tarball(f"{chart_server.url}/files/evil.tgz", tmp_path / "b")
    kept = sorted(str(p.relative_to(tmp_path / "b")) for p in (tmp_path / "b").rglob("*"))
    assert kept == ["greeter", "greeter/Chart.yaml"]
    assert not (tmp_path / "escape.yaml").exists()


def test_the_store_fetches_a_pinned_url_once_and_checks_its_chart(
    chart_server: source_servers.SourceServer, tmp_path: Path, helm: Path
) -> None:
    chart_server.files["greeter.tgz"] = chart_tarball(chart_files())
    store = content.Store(tmp_path / "store")
    pinned, root = store.fetch(f"{chart_server.url}/files/greeter.tgz")
    assert "#sha256=" in pinned
    assert chart.check(helm, chart.find_chart(root))["name"] == "greeter"
    served = len(chart_server.requests)
    assert store.fetch(pinned) == (pinned, root)
    assert len(chart_server.requests) == served  # fetched once


# -- end to end on the local kubelet ------------------------------------------------------

SUFFIX = uuid.uuid4().hex[:6]
HELM_IMAGE_BUILD = CONTRIB / "hack" / "build-image.sh"


def build_helm_image(ref: str) -> str:
    """The helm provisioner's image (RukPak's + one layer), pushed; ``repo@digest``."""
    with tempfile.TemporaryDirectory(prefix="rk-helm-image-") as tmp:
        digest_file = Path(tmp) / "digest"
        done = subprocess.run(
            ["bash", str(HELM_IMAGE_BUILD), "--digest-file", str(digest_file), ref],
            capture_output=True,
            text=True,
            timeout=1800,
            check=False,
        )
        if done.returncode != 0:
            raise AssertionError(f"{HELM_IMAGE_BUILD} failed:\n{done.stdout[-3000:]}{done.stderr}")
        return f"{ref.rsplit(':', 1)[0]}@{digest_file.read_text().strip()}"


def write_overlay(directory: Path, *, image: str, api_server: dict[str, str]) -> Path:
    """contrib/helm-provisioner/manifests + deploy's host-network component + the image."""
    directory.mkdir(parents=True, exist_ok=True)
    rel = Path(os.path.relpath(REPO, directory))
    name, digest = image.split("@", 1)
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [str(rel / "contrib" / "helm-provisioner" / "manifests")],
        "components": [str(rel / "deploy" / "components" / "host-network")],
        "configMapGenerator": [
            {
                "name": "rukpak-apiserver",
                "namespace": inst.NAMESPACE,
                "literals": [f"{k}={v}" for k, v in sorted(api_server.items())],
            }
        ],
        "images": [{"name": "rukpak-helm-provisioner", "newName": name, "digest": digest}],
    }
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(kustomization, sort_keys=False))
    return directory


@pytest.fixture(scope="module")
def helm_system(rukpak_system: inst.RukpakSystem) -> Iterator[inst.RukpakSystem]:
    """RukPak with the helm provisioner installed from its own manifests, rolled out."""
    system = rukpak_system
    image = build_helm_image(f"{system.registry_host}/rukpak/rukpak-helm-provisioner:e2e")
    overlay = write_overlay(
        system.workdir / "helm-overlay", image=image, api_server=system.cluster.in_cluster_env()
    )
    rendered = system.workdir / "helm-provisioner.yaml"
    rendered.write_text(system.kubectl("kustomize", str(overlay)))
    system.kubectl("apply", "-f", str(rendered), timeout=120)
    docs = [d for d in yaml.safe_load_all(rendered.read_text()) if d]
    inst.rollout(system, docs, timeout=inst.ROLLOUT_TIMEOUT)
    try:
        yield system
    finally:
        for name in system.kubectl("get", "bundledeployments", "-o", "name", check=False).split():
            if SUFFIX in name:
                system.kubectl("delete", name, "--timeout=120s", timeout=150, check=False)
        system.kubectl("delete", "-f", str(rendered), "--ignore-not-found", "--timeout=120s",
                       timeout=150, check=False)  # fmt: skip


def helm_bd(name: str, ref: str, values: str) -> api.Obj:
    return {
        "apiVersion": api.API_VERSION,
        "kind": "BundleDeployment",
        "metadata": {"name": name},
        "spec": {
            "provisionerClassName": plan.CLASS,
            "installNamespace": name,
            "config": {"values": values},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "provisionerClassName": plan.CLASS,
                    "source": {"type": "image", "image": {"ref": ref}},
                },
            },
        },
    }


def bd_state(system: inst.RukpakSystem, name: str) -> dict[str, Any]:
    return system.kube.get(api.bundle_deployment_ref(name)) or {}


def configmap(system: inst.RukpakSystem, namespace: str, name: str) -> api.Obj | None:
    return system.kube.get(api.ObjectRef("", "v1", "ConfigMap", namespace, name))


def condition(obj: api.Obj, kind: str) -> tuple[str, str, str]:
    cond = inst.conditions(obj).get(kind) or {}
    return str(cond.get("status")), str(cond.get("reason")), str(cond.get("message"))


def push_chart(system: inst.RukpakSystem, tag: str, files: dict[str, str]) -> str:
    layer = chart_entries(files, under="greeter")
    return csi_helpers.push_image(system.registry_host, f"e2e-helm-{SUFFIX}", tag, [layer]).ref


def diagnose(system: inst.RukpakSystem, name: str) -> str:
    """What a failure message needs: the BundleDeployment, its Bundles, the logs."""
    out = [
        system.kubectl("get", "bundledeployment", name, "-o", "yaml", check=False),
        system.kubectl("get", "bundles", "-l", f"app={name}", "-o", "yaml", check=False),
        system.kubectl("logs", "-n", inst.NAMESPACE, "deployment/rukpak-helm-provisioner",
                       "--tail=60", check=False),
    ]  # fmt: skip
    return "\n".join(out)


@pytest.mark.cluster
@pytest.mark.slow
def test_a_chart_installs_re_renders_on_new_values_and_survives_a_broken_chart(
    helm_system: inst.RukpakSystem,
) -> None:
    name = f"greeter-{SUFFIX}"
    try:
        _chart_lifecycle(helm_system, name)
    except AssertionError as err:
        raise AssertionError(f"{err}\n{diagnose(helm_system, name)}") from None


def _chart_lifecycle(system: inst.RukpakSystem, name: str) -> None:
    good = push_chart(system, "v1", chart_files(deployment=True))
    values = f"greeting: hello\nextra: true\nimage: {system.busybox_image}\n"
    system.kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    system.kube.create(helm_bd(name, good, values))

    # installed: the chart's objects with the BundleDeployment's values, upstream's words.
    # (the core manager leaves this class alone: see the test after this one)
    live = eventually(
        lambda: (
            s
            if condition(s := bd_state(system, name), "Installed")[:2]
            == ("True", "InstallationSucceeded")
            else None
        ),
        timeout=180,
        what=f"BundleDeployment {name} Installed",
    )
    active = live["status"]["activeBundle"]
    assert condition(live, "Installed")[1:] == (
        "InstallationSucceeded",
        f"Instantiated bundle {active} successfully",
    )
    assert condition(live, "HasValidBundle")[:2] == ("True", "UnpackSuccessful")
    bundle = system.kube.get(api.bundle_ref(active)) or {}
    assert bundle["status"]["phase"] == "Unpacked"
    assert "@sha256:" in bundle["status"]["resolvedSource"]["image"]["ref"]
    greeting = configmap(system, name, f"{name}-greeting") or {}
    assert greeting["data"] == {"greeting": "hello"}
    assert greeting["metadata"]["labels"][api.OWNER_LABEL] == name
    assert configmap(system, name, f"{name}-extra") is not None
    web = api.ObjectRef("apps", "v1", "Deployment", name, f"{name}-web")
    eventually(
        lambda: ((system.kube.get(web) or {}).get("status") or {}).get("availableReplicas"),
        timeout=120,
        what=f"Deployment {name}-web available",
    )

    # drift: a deleted object comes back
    system.kube.delete(api.ObjectRef("", "v1", "ConfigMap", name, f"{name}-greeting"))
    eventually(
        lambda: configmap(system, name, f"{name}-greeting"),
        timeout=60,
        what="the deleted ConfigMap recreated",
    )

    # new values: re-rendered, and what the new render lacks is pruned
    new_values = f"greeting: bye\nextra: false\nimage: {system.busybox_image}\n"
    system.kube.merge_patch(
        api.bundle_deployment_ref(name), {"spec": {"config": {"values": new_values}}}
    )
    eventually(
        lambda: (
            (configmap(system, name, f"{name}-greeting") or {}).get("data") == {"greeting": "bye"}
        ),
        timeout=60,
        what="the greeting re-rendered with the new values",
    )
    eventually(
        lambda: configmap(system, name, f"{name}-extra") is None,
        timeout=60,
        what="the extra ConfigMap pruned",
    )

    # a broken chart (a new template: a new Bundle): Installed=False saying why, the
    # previous install stays as it was
    broken = push_chart(system, "v2-broken", chart_files(deployment=True, broken=True))
    system.kube.merge_patch(
        api.bundle_deployment_ref(name),
        {"spec": {"template": {"spec": {"source": {"image": {"ref": broken}}}}}},
    )
    failed = eventually(
        lambda: (
            s
            if condition(s := bd_state(system, name), "Installed")[:2] == ("False", "InstallFailed")
            else None
        ),
        timeout=120,
        what="Installed=False for the broken chart",
    )
    _, reason, message = condition(failed, "Installed")
    assert reason == "InstallFailed"
    assert "helm template failed" in message and "broken.yaml" in message
    assert f"{active} stays installed" in message
    assert failed["status"]["activeBundle"] == active
    assert (configmap(system, name, f"{name}-greeting") or {}).get("data") == {"greeting": "bye"}
    assert system.kube.get(api.bundle_ref(active)) is not None
    events = system.kubectl(
        "get", "events", "-n", "default", "--field-selector",
        f"involvedObject.name={name},reason=InstallFailed", "-o", "name",
    )  # fmt: skip
    assert events.strip(), "no InstallFailed event"

    # deleting the BundleDeployment uninstalls what the chart installed
    system.kubectl("delete", "bundledeployment", name, "--timeout=120s", timeout=150)
    assert configmap(system, name, f"{name}-greeting") is None
    assert system.kube.get(web) is None
    assert system.kube.get(api.bundle_ref(active)) is None


@pytest.mark.cluster
@pytest.mark.slow
def test_a_bundle_without_a_chart_fails_with_a_message(helm_system: inst.RukpakSystem) -> None:
    system = helm_system
    name = f"nochart-{SUFFIX}"
    ref = csi_helpers.push_image(
        system.registry_host, f"e2e-helm-{SUFFIX}", "nochart",
        [[("manifests/", "dir"), ("manifests/a.yaml", "file", b"kind: ConfigMap\n")]],
    ).ref  # fmt: skip
    system.kube.create(
        {
            "apiVersion": api.API_VERSION,
            "kind": "Bundle",
            "metadata": {"name": name},
            "spec": {
                "provisionerClassName": plan.CLASS,
                "source": {"type": "image", "image": {"ref": ref}},
            },
        }
    )
    try:
        live = eventually(
            lambda: b if ((b := system.kube.get(api.bundle_ref(name)) or {}).get("status") or {})
            .get("phase") == "Failing" else None,
            timeout=60,
            what=f"Bundle {name} Failing",
        )  # fmt: skip
        assert condition(live, "Unpacked")[:2] == ("False", "UnpackFailed")
        assert "no helm chart in the bundle" in condition(live, "Unpacked")[2]
    finally:
        system.kube.delete(api.bundle_ref(name))


@pytest.mark.cluster
@pytest.mark.slow
def test_the_core_manager_leaves_helm_bundle_deployments_alone(
    helm_system: inst.RukpakSystem,
) -> None:
    system = helm_system
    name = f"alone-{SUFFIX}"
    ref = push_chart(system, "alone", chart_files())
    system.kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    system.kube.create(helm_bd(name, ref, "greeting: alone\n"))
    try:
        eventually(
            lambda: condition(bd_state(system, name), "Installed")[0] == "True",
            timeout=120,
            what=f"BundleDeployment {name} Installed",
        )
        # the manager has seen it: the Bundle the helm provisioner created is in its cache
        # too, and its informer delivers BundleDeployments before later Bundles
        assert bd_state(system, name)["metadata"]["finalizers"] == [plan.FINALIZER]
        refused = system.kubectl(
            "get", "events", "-n", "default", "--field-selector",
            f"involvedObject.name={name},reason=UnsupportedProvisionerClass", "-o", "name",
        )  # fmt: skip
        assert not refused.strip(), refused
    finally:
        system.kubectl("delete", "bundledeployment", name, "--timeout=120s", timeout=150,
                       check=False)  # fmt: skip


def v2_ref(name: str) -> api.ObjectRef:
    return api.ObjectRef(api.GROUP, "v1alpha2", "BundleDeployment", "", name)


def installed_v2(system: inst.RukpakSystem, name: str) -> api.Obj:
    """The v1alpha2 BundleDeployment ``name`` once it is Installed."""

    def live() -> api.Obj | None:
        found = system.kube.get(v2_ref(name)) or {}
        return found if condition(found, "Installed")[0] == "True" else None

    found: api.Obj = eventually(
        live, timeout=120, what=f"v1alpha2 BundleDeployment {name} Installed"
    )
    return found


@pytest.mark.cluster
@pytest.mark.slow
def test_a_v1alpha2_bundle_deployment_installs_a_chart_named_inline(
    helm_system: inst.RukpakSystem,
) -> None:
    """Created as v1alpha2 with ``format: helm``: no Bundle object; the image pinned into
    ``resolvedSource``; the chart rendered with the values, again when they change; the
    core manager leaves it alone; deleting it uninstalls."""
    system = helm_system
    name = f"inline-{SUFFIX}"
    ref = push_chart(system, "inline", chart_files())
    system.kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    system.kube.create(
        {
            "apiVersion": f"{api.GROUP}/v1alpha2",
            "kind": "BundleDeployment",
            "metadata": {"name": name},
            "spec": {
                "format": "helm",
                "installNamespace": name,
                "source": {"type": "image", "image": {"ref": ref}},
                "config": {"values": "greeting: inline\nextra: true\n"},
            },
        }
    )
    try:
        live = installed_v2(system, name)
        pinned = live["status"]["resolvedSource"]["image"]["ref"]
        assert pinned.startswith(ref.rsplit(":", 1)[0] + "@sha256:"), pinned
        assert condition(live, "Unpacked")[:2] == ("True", "UnpackSuccessful")
        assert condition(live, "HasValidBundle")[:2] == ("True", "UnpackSuccessful")
        revision = inline.revision_name(live, pinned)
        assert condition(live, "Installed")[1:] == (
            "InstallationSucceeded",
            f"Instantiated bundle {revision} successfully",
        )
        assert live["metadata"]["finalizers"] == [plan.FINALIZER]  # the core's is not there
        owned = system.kubectl("get", "bundles", "-o", "name", "-l",
                               f"{plan.OWNER_NAME_LABEL}={name}")  # fmt: skip
        assert not owned.strip(), f"a v1alpha2 BundleDeployment got Bundles: {owned}"
        assert (configmap(system, name, f"{name}-greeting") or {}).get("data") == {
            "greeting": "inline"
        }
        assert configmap(system, name, f"{name}-extra") is not None

        # new values: a new generation, pinned again (the same digest), re-rendered, pruned
        system.kube.merge_patch(
            v2_ref(name), {"spec": {"config": {"values": "greeting: again\nextra: false\n"}}}
        )
        eventually(
            lambda: (configmap(system, name, f"{name}-greeting") or {}).get("data")
            == {"greeting": "again"},
            timeout=60,
            what="the greeting re-rendered with the new values",
        )  # fmt: skip
        eventually(
            lambda: configmap(system, name, f"{name}-extra") is None,
            timeout=60,
            what="the extra ConfigMap pruned",
        )
        again = system.kube.get(v2_ref(name)) or {}
        assert again["status"]["resolvedSource"]["image"]["ref"] == pinned
    except AssertionError as err:
        raise AssertionError(f"{err}\n{diagnose(system, name)}") from None
    finally:
        system.kubectl("delete", "bundledeployment", name, "--timeout=120s", timeout=150,
                       check=False)  # fmt: skip
    eventually(
        lambda: configmap(system, name, f"{name}-greeting") is None,
        timeout=60,
        what="the chart's ConfigMap uninstalled",
    )


UPSTREAM_HELM_EXAMPLE = (
    REPO / "tests" / "data" / "upstream-examples-v1alpha2" / "bundledeployment-helm.yaml"
)
AHOY_TPL = configmap_template("ahoy", "replicas", ".Values.replicaCount")


@pytest.mark.cluster
@pytest.mark.slow
def test_upstream_s_helm_example_installs_its_chart_from_an_http_url(
    helm_system: inst.RukpakSystem, tmp_path: Path
) -> None:
    """Upstream v0.24's own helm example, with only its name, namespace and URL changed to
    ones this machine has: the chart's tarball served over HTTP, its values applied."""
    system = helm_system
    name = f"ahoy-{SUFFIX}"
    files = {"Chart.yaml": "apiVersion: v2\nname: hello-world\nversion: 0.1.0\n",
             "values.yaml": "replicaCount: 1\n", "templates/ahoy.yaml": AHOY_TPL}  # fmt: skip
    example = yaml.safe_load(UPSTREAM_HELM_EXAMPLE.read_text())
    with source_servers.serving(tmp_path / "git") as server:
        server.files["hello-world-0.1.0.tgz"] = chart_tarball(files, under="hello-world")
        example["metadata"]["name"] = name
        example["spec"]["installNamespace"] = name
        example["spec"]["source"]["http"]["url"] = f"{server.url}/files/hello-world-0.1.0.tgz"
        system.kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        system.kube.create(example)
        try:
            live = installed_v2(system, name)
            assert condition(live, "Unpacked")[:2] == ("True", "UnpackSuccessful")
            resolved = live["status"]["resolvedSource"]
            assert resolved["type"] == "http" and "#sha256=" in resolved["http"]["url"]
            assert (configmap(system, name, f"{name}-ahoy") or {}).get("data") == {"replicas": "3"}
        except AssertionError as err:
            raise AssertionError(f"{err}\n{diagnose(system, name)}") from None
        finally:
            system.kubectl("delete", "bundledeployment", name, "--timeout=120s", timeout=150,
                           check=False)  # fmt: skip
