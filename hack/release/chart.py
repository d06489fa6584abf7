"""The Helm chart (charts/rukpak) generated from deploy/, and its packaging for a release.

Where it sits: ``deploy/`` (kustomize) is the one source of the install; the chart must
install exactly what ``kubectl apply -k`` of the matching overlay would. So the chart's
templates are not written by hand: ``generate`` renders ``deploy/`` with kustomize once
per combination of the optional components the chart exposes as switches
(``hostNetwork``, ``monitoring``, ``registryMirror``; ``kubelet-root`` is always on), each
with sentinel values where the chart takes values (the image, kubelet root, state dir,
API server address, mirror upstream, container resources). Every object then becomes a
template: its text with the sentinels replaced by template expressions, wrapped in an
``if`` over the switches when it exists, or differs, in some combinations only. Braces
already in the manifests (alert templates, the dashboard) are escaped for Helm.

``tests/test_release.py`` regenerates the templates and fails when the committed chart
differs (run ``python hack/release/chart.py generate`` after changing ``deploy/``).
``package`` (``make release``) copies the chart, sets its version and the image pinned
by digest in ``values.yaml``, and runs ``helm package``.

    python hack/release/chart.py generate [CHART_DIR]
    python hack/release/chart.py package --version V --image REPO@DIGEST --helm HELM OUT_DIR
    python hack/release/chart.py manifest --version V --image REPO@DIGEST OUT.yaml
"""

from __future__ import annotations

import argparse
import difflib
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
CHART = REPO / "charts" / "rukpak"
NAMESPACE = "rukpak-system"

# switch (values key) -> the kustomize component it adds
SWITCHES = {
    "hostNetwork": "host-network",
    "monitoring": "monitoring",
    "registryMirror": "registry-mirror",
}
IMAGE = "rk-image.invalid/rukpak-python:rk-tag"
SENTINELS = {
    IMAGE: '{{ include "rukpak.image" . }}',
    "/rk-kubelet-root": "{{ .Values.kubeletRoot }}",
    "/rk-state-dir": "{{ .Values.stateDir }}",
    "rk-apiserver-host": '{{ required "hostNetwork.apiServerHost is required when '
    'hostNetwork.enabled" .Values.hostNetwork.apiServerHost | quote }}',
    "rk-apiserver-port": '{{ required "hostNetwork.apiServerPort is required when '
    'hostNetwork.enabled" .Values.hostNetwork.apiServerPort | toString | quote }}',
    "rk-version": "{{ .Chart.AppVersion | quote }}",
    "rk-mirror-upstream.invalid": '{{ required "registryMirror.upstream is required when '
    'registryMirror.enabled" .Values.registryMirror.upstream | quote }}',
}
RESOURCES = "rk-resources:"  # + WORKLOAD/CONTAINER, replaced by a toYaml of the values


def kustomize_command() -> list[str]:
    """How to run kustomize: $KUSTOMIZE, the binary hack/gotool.sh builds, or the cached
    kubectl's ``kubectl kustomize`` (same kustomize, v5.7.1, in kubectl 1.34)."""
    if os.environ.get("KUSTOMIZE"):
        return [os.environ["KUSTOMIZE"], "build"]
    built = subprocess.run(
        ["bash", str(REPO / "hack" / "gotool.sh"), "kustomize", "--print-path"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if built.returncode == 0 and Path(built.stdout.strip()).is_file():
        return [built.stdout.strip(), "build"]
    sys.path.insert(0, str(REPO))
    from tests.cluster import bins

    kubectl = bins.find("kubectl")
    if kubectl is None:
        raise SystemExit("chart.py: no kustomize; run `bash hack/gotool.sh kustomize`")
    return [str(kubectl), "kustomize"]


def version_patch(version: str) -> dict[str, Any]:
    """The kustomize patch that sets the manager's app.kubernetes.io/version labels."""
    ops = [
        {"op": "add", "path": f"{where}/labels/app.kubernetes.io~1version", "value": version}
        for where in ("/metadata", "/spec/template/metadata")
    ]
    return {
        "target": {"kind": "Deployment", "name": "rukpak-manager"},
        "patch": yaml.safe_dump(ops),
    }


def render(
    components: list[str],
    *,
    kustomize: list[str],
    image: str = IMAGE,
    version: str = "rk-version",
    sentinels: bool = True,
) -> list[dict[str, Any]]:
    """``deploy/`` + ``components`` (+ kubelet-root with the sentinel values, unless
    ``sentinels`` is False: then deploy/ and components only), the image ``image``
    (``REPO:TAG`` or ``REPO@DIGEST``) and the version label ``version``."""
    with tempfile.TemporaryDirectory(prefix="rk-chart-", dir=REPO) as tmp:
        overlay = Path(tmp)
        rel = os.path.relpath(DEPLOY, overlay)
        generators: list[dict[str, Any]] = [
            {"name": "rukpak-node-paths", "literals": [
                "kubeletRoot=/rk-kubelet-root", "stateDir=/rk-state-dir"]},
        ] if sentinels else []  # fmt: skip
        if "host-network" in components:
            generators.append({
                "name": "rukpak-apiserver", "namespace": NAMESPACE,
                "literals": ["KUBERNETES_SERVICE_HOST=rk-apiserver-host",
                             "KUBERNETES_SERVICE_PORT=rk-apiserver-port"],
                "options": {"disableNameSuffixHash": True},
            })  # fmt: skip
        if "registry-mirror" in components:
            generators.append({
                "name": "rukpak-registry-mirror", "namespace": NAMESPACE,
                "literals": ["upstream=rk-mirror-upstream.invalid"],
                "options": {"disableNameSuffixHash": True},
            })  # fmt: skip
        if "@" in image:
            name, _, digest = image.partition("@")
            pin = {"name": "rukpak-python", "newName": name, "digest": digest}
        else:
            name, _, tag = image.rpartition(":")
            pin = {"name": "rukpak-python", "newName": name, "newTag": tag}
        every = ["kubelet-root", *components] if sentinels else components
        kustomization = {
            "apiVersion": "kustomize.config.k8s.io/v1beta1",
            "kind": "Kustomization",
            "resources": [rel],
            "components": [f"{rel}/components/{c}" for c in every],
            "configMapGenerator": generators,
            "images": [pin],
            "patches": [version_patch(version)],
        }
        if not generators:
            del kustomization["configMapGenerator"]
        (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
        done = subprocess.run(
            [*kustomize, str(overlay)], capture_output=True, text=True, check=False
        )
    if done.returncode != 0:
        raise SystemExit(f"chart.py: kustomize of {components} failed: {done.stderr}")
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def _key(doc: dict[str, Any]) -> tuple[str, str, str, str]:
    meta = doc["metadata"]
    return (doc["apiVersion"], doc["kind"], meta.get("namespace", ""), meta["name"])


def _mark_resources(doc: dict[str, Any], defaults: dict[str, dict[str, Any]]) -> None:
    """Replace each workload container's resources with a sentinel; collect defaults."""
    if doc["kind"] not in ("Deployment", "DaemonSet"):
        return
    workload = doc["metadata"]["name"]
    for container in doc["spec"]["template"]["spec"].get("containers", []):
        if "resources" in container:
            defaults.setdefault(workload, {})[container["name"]] = container["resources"]
            container["resources"] = f"{RESOURCES}{workload}/{container['name']}"


def _text(doc: dict[str, Any]) -> str:
    """One object as template text: braces escaped, sentinels replaced."""
    text = yaml.safe_dump(doc, sort_keys=False, width=1 << 20, default_flow_style=False)
    text = text.replace("{{", '{{ "{{" }}')
    for sentinel, expression in SENTINELS.items():
        text = text.replace(sentinel, expression)

    def resources(m: re.Match[str]) -> str:
        indent, workload, container = m.group(1), m.group(2), m.group(3)
        return (
            f"{indent}resources:\n{indent}  "
            f'{{{{- toYaml (index .Values.resources "{workload}" "{container}") '
            f"| nindent {len(indent) + 2} }}}}"
        )

    text = re.sub(rf"^( *)resources: {RESOURCES}([^/\n]+)/([^\n]+)$", resources, text, flags=re.M)
    if any(s in text for s in SENTINELS) or RESOURCES in text:
        raise SystemExit(f"chart.py: a sentinel survived in {_key(doc)}")
    return text


def _switch(name: str, on: bool) -> str:
    return f".Values.{name}.enabled" if on else f"(not .Values.{name}.enabled)"


def _condition(combos: set[tuple[bool, ...]]) -> str | None:
    """A Helm condition true for exactly ``combos`` of the switches (None: always)."""
    names = list(SWITCHES)
    every = set(itertools.product([False, True], repeat=len(names)))
    if combos == every:
        return None
    # only the switches that matter within combos
    relevant = [
        i
        for i in range(len(names))
        if any((*c[:i], not c[i], *c[i + 1 :]) not in combos for c in combos)
    ]
    terms = sorted({tuple((i, c[i]) for i in relevant) for c in combos})

    def term(t: tuple[tuple[int, bool], ...]) -> str:
        parts = [_switch(names[i], on) for i, on in t]
        if len(parts) == 1:
            return parts[0].removeprefix("(").removesuffix(")") if len(terms) == 1 else parts[0]
        return f"and {' '.join(parts)}" if len(terms) == 1 else f"(and {' '.join(parts)})"

    return term(terms[0]) if len(terms) == 1 else f"or {' '.join(term(t) for t in terms)}"


def _merged(variants: dict[tuple[bool, ...], str]) -> str | None:
    """One template for an object whose text differs by switch: the text of its first
    combo, with each switch's own changes as ``if`` blocks. None when the switches'
    changes do not combine line by line (then each variant is emitted whole)."""
    names = list(SWITCHES)
    combos = sorted(variants)
    base = combos[0]
    lines = variants[base].splitlines(keepends=True)
    removed: list[list[tuple[int, bool]]] = [[] for _ in lines]  # (switch, when) it goes
    inserted: dict[int, list[tuple[int, bool, list[str]]]] = {}
    for i in range(len(names)):
        flipped = (*base[:i], not base[i], *base[i + 1 :])
        if flipped not in variants or variants[flipped] == variants[base]:
            continue
        other = variants[flipped].splitlines(keepends=True)
        matcher = difflib.SequenceMatcher(None, lines, other, autojunk=False)
        for op, i1, i2, j1, j2 in matcher.get_opcodes():
            if op == "equal":
                continue
            if i1 == 0:
                return None  # a change on the first line: no room for `{{-`
            for k in range(i1, i2):
                removed[k].append((i, not base[i]))
            if j2 > j1:
                inserted.setdefault(i2, []).append((i, not base[i], other[j1:j2]))

    def select(combo: tuple[bool, ...], order: tuple[int, ...]) -> str:
        out: list[str] = []
        for k in range(len(lines) + 1):
            blocks = sorted(inserted.get(k, []), key=lambda b: order.index(b[0]))
            out += [x for i, when, block in blocks if combo[i] == when for x in block]
            if k < len(lines) and not any(combo[i] == when for i, when in removed[k]):
                out.append(lines[k])
        return "".join(out)

    # two switches adding lines at one place: the order kustomize gives them decides
    orders = [o for o in itertools.permutations(range(len(names)))
              if all(select(c, o) == variants[c] for c in combos)]  # fmt: skip
    if not orders:
        return None
    text: list[str] = []
    k = 0
    while k <= len(lines):
        for i, when, block in sorted(inserted.get(k, []), key=lambda b: orders[0].index(b[0])):
            text += [
                f"{{{{- if {_switch(names[i], when).strip('()')} }}}}\n",
                *block,
                "{{- end }}\n",
            ]
        if k == len(lines):
            break
        if not removed[k]:
            text.append(lines[k])
            k += 1
            continue
        end = k + 1  # consecutive lines that go under the same switches: one block
        while end < len(lines) and removed[end] == removed[k] and end not in inserted:
            end += 1
        keep = " ".join(_switch(names[i], not when) for i, when in removed[k])
        keep = keep.strip("()") if len(removed[k]) == 1 else f"and {keep}"
        text += [f"{{{{- if {keep} }}}}\n", *lines[k:end], "{{- end }}\n"]
        k = end
    return "".join(text)


def generate(chart: Path) -> None:
    """Write ``chart``'s templates/ and values.yaml's resources from the renders."""
    kustomize = kustomize_command()
    names = list(SWITCHES)
    variants: dict[tuple[str, str, str, str], dict[str, set[tuple[bool, ...]]]] = {}
    order: list[tuple[str, str, str, str]] = []
    defaults: dict[str, dict[str, Any]] = {}
    for combo in itertools.product([False, True], repeat=len(names)):
        components = [SWITCHES[n] for n, on in zip(names, combo, strict=True) if on]
        for doc in render(components, kustomize=kustomize):
            _mark_resources(doc, defaults)
            key = _key(doc)
            if key not in variants:
                variants[key] = {}
                order.append(key)
            variants[key].setdefault(_text(doc), set()).add(combo)
    files: dict[str, list[str]] = {}
    for key in order:
        by_combo = {c: text for text, combos in variants[key].items() for c in combos}
        merged = _merged(by_combo) if len(variants[key]) > 1 else None
        pieces = [(merged, set(by_combo))] if merged else list(variants[key].items())
        chunks = []
        for text, combos in pieces:
            condition = _condition(combos)
            if condition is None:
                chunks.append(f"---\n{text}")
            else:
                chunks.append(f"{{{{- if {condition} }}}}\n---\n{text}{{{{- end }}}}\n")
        kind = key[1]
        files.setdefault(re.sub(r"(?<!^)(?=[A-Z])", "-", kind).lower(), []).extend(chunks)
    templates = chart / "templates"
    for old in templates.glob("*.yaml"):
        old.unlink()
    templates.mkdir(parents=True, exist_ok=True)
    header = "# Generated from deploy/ by hack/release/chart.py generate: do not edit.\n"
    for name, chunks in sorted(files.items()):
        (templates / f"{name}.yaml").write_text(header + "".join(chunks))
    values_path = chart / "values.yaml"
    values = values_path.read_text()
    marker = "# --- resources (generated from deploy/) ---\n"
    head = values.split(marker)[0] if marker in values else values
    block = yaml.safe_dump({"resources": defaults}, sort_keys=True, default_flow_style=False)
    values_path.write_text(head + marker + block)


def package(out: Path, *, version: str, image: str, helm: str) -> Path:
    """``helm package`` of the chart with ``version`` and ``image`` (REPO@DIGEST) pinned."""
    repository, _, digest = image.partition("@")
    if not digest.startswith("sha256:"):
        raise SystemExit(f"chart.py: --image wants REPO@sha256:..., not {image}")
    with tempfile.TemporaryDirectory(prefix="rk-chart-") as tmp:
        chart = Path(tmp) / "rukpak"
        shutil.copytree(CHART, chart)
        meta = chart / "Chart.yaml"
        text = re.sub(r"(?m)^version: .*$", f"version: {version}", meta.read_text())
        text = re.sub(r"(?m)^appVersion: .*$", f'appVersion: "{version}"', text)
        meta.write_text(text)
        values = chart / "values.yaml"
        text = re.sub(r"(?m)^  repository: .*$", f"  repository: {repository}", values.read_text())
        text = re.sub(r"(?m)^  digest: .*$", f"  digest: {digest}", text)
        values.write_text(text)
        lint = subprocess.run([helm, "lint", "--strict", str(chart)], capture_output=True,
                              text=True, check=False)  # fmt: skip
        if lint.returncode != 0:
            raise SystemExit(f"chart.py: helm lint failed:\n{lint.stdout}{lint.stderr}")
        out.mkdir(parents=True, exist_ok=True)
        subprocess.run([helm, "package", "--destination", str(out), str(chart)],
                       check=True, capture_output=True)  # fmt: skip
    return out / f"rukpak-{version}.tgz"


def manifest(out: Path, *, version: str, image: str) -> int:
    """Write ``out``: deploy/ rendered as one file, the image pinned (``REPO@DIGEST``) and
    the version label set, what ``kubectl apply -f`` installs. Returns the object count."""
    docs = render([], kustomize=kustomize_command(), image=image, version=version,
                  sentinels=False)  # fmt: skip
    header = (
        f"# RukPak {version}: deploy/ rendered by make release (hack/release). Install with\n"
        f"#   kubectl apply --server-side -f {out.name}\n"
    )
    body = "".join("---\n" + yaml.safe_dump(d, sort_keys=False, width=1 << 20) for d in docs)
    out.write_text(header + body)
    return len(docs)


def main() -> None:
    p = argparse.ArgumentParser(prog="chart.py", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate")
    g.add_argument("chart", type=Path, nargs="?", default=CHART)
    k = sub.add_parser("package")
    k.add_argument("--version", required=True)
    k.add_argument("--image", required=True)
    k.add_argument("--helm", required=True)
    k.add_argument("out", type=Path)
    m = sub.add_parser("manifest")
    m.add_argument("--version", required=True)
    m.add_argument("--image", required=True)
    m.add_argument("out", type=Path)
    args = p.parse_args()
    if args.command == "generate":
        generate(args.chart)
    elif args.command == "manifest":
        count = manifest(args.out, version=args.version, image=args.image)
        print(f"wrote {args.out} ({count} objects, image {args.image})")
    else:
        print(package(args.out, version=args.version, image=args.image, helm=args.helm))


if __name__ == "__main__":
    main()
