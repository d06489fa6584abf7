#!/usr/bin/env bash
# `make release VERSION=x.y.z`: everything a release ships, offline and without a container
# engine, into dist/ (DIST):
#
#   rukpak-python-V.oci.tar      the image for every arch of ARCHES as one OCI image index,
#                                an OCI layout archive (hack/release/push.sh pushes it)
#   rukpak.yaml                  deploy/ rendered as one file, the image pinned by digest
#   rukpak-V.tgz                 the same install as a Helm chart (charts/rukpak), linted
#   rukpak_python-V-*.whl, .tar.gz  the CLI (rukpak, kubectl-rukpak) as wheel and sdist
#   rukpak-python-V.spdx.json    SBOM of the images (Debian and Python packages, SPDX 2.3)
#   SHA256SUMS                   checksums of all of the above
#
#   hack/release/release.sh VERSION
#
# Environment: ARCHES ("amd64 arm64"), IMAGE_REPO (where the image will be pushed, which
# rukpak.yaml and the chart name; quay.io/operator-framework/rukpak-python), DIST (dist),
# PYTHON (the repo venv's python), SOURCE_DATE_EPOCH (the last commit's date). Needs root
# (hack/image/build.sh). Kustomize and helm come from hack/gotool.sh (built once, cached).
# Same sources and cached base layers give the same bytes (and the same image digest).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$REPO/hack/release
PY=${PYTHON:-$REPO/.venv/bin/python}
ARCHES=${ARCHES:-amd64 arm64}
IMAGE_REPO=${IMAGE_REPO:-quay.io/operator-framework/rukpak-python}
DIST=${DIST:-$REPO/dist}
START=$SECONDS
step() { printf '==> [%4ss] %s\n' "$((SECONDS - START))" "$*"; }

version=${1:-}
if [[ ! $version =~ ^[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]]; then
    echo "usage: release.sh VERSION (semver x.y.z, got '${version}')" >&2
    exit 2
fi
[[ -x $PY ]] || { echo "release.sh: no $PY; run make setup first" >&2; exit 1; }
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git -C "$REPO" log -1 --format=%ct 2>/dev/null || echo 315532800)}
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}

work=$(mktemp -d "${TMPDIR:-/tmp}/rk-release.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$DIST"
rm -f "$DIST"/rukpak-python-*.oci.tar "$DIST"/rukpak-*.tgz "$DIST"/rukpak_python-* \
    "$DIST"/rukpak.yaml "$DIST"/*.spdx.json "$DIST"/SHA256SUMS "$DIST"/IMAGE

step "tools: kustomize and helm (hack/gotool.sh, cached)"
bash "$REPO/hack/gotool.sh" kustomize --quiet
bash "$REPO/hack/gotool.sh" helm --quiet
export KUSTOMIZE=$(bash "$REPO/hack/gotool.sh" kustomize --print-path)
helm=$(bash "$REPO/hack/gotool.sh" helm --print-path)

layouts=()
for arch in $ARCHES; do
    step "image: linux/$arch (hack/image/build.sh --arch $arch)"
    PYTHON=$PY bash "$REPO/hack/image/build.sh" --arch "$arch" --oci-layout "$work/layout-$arch" \
        --tag "$version" | sed 's/^/    /'
    layouts+=("$work/layout-$arch")
done
step "image: one index over ${ARCHES// /, }"
digest=$("$PY" "$HERE/ocindex.py" merge --tag "$version" "$work/oci" "${layouts[@]}")
"$PY" "$HERE/ocindex.py" archive "$work/oci" "$DIST/rukpak-python-$version.oci.tar"
image=$IMAGE_REPO@$digest
echo "    $image"

step "manifests: rukpak.yaml and the Helm chart (image pinned by digest)"
"$PY" "$HERE/chart.py" manifest --version "$version" --image "$image" "$DIST/rukpak.yaml" | sed 's/^/    /'
"$PY" "$HERE/chart.py" package --version "$version" --image "$image" --helm "$helm" "$DIST" |
    sed 's/^/    /'

step "CLI: wheel and sdist"
src=$work/src
mkdir -p "$src"
git -C "$REPO" ls-files -z -co --exclude-standard -- pyproject.toml README.md LICENSE rukpak csi \
    provisioner | (cd "$REPO" && tar --null -T - -cf - 2>/dev/null) | tar -C "$src" -xf -
sed -i "s/^version = \".*\"/version = \"$version\"/" "$src/pyproject.toml"
# setuptools' PEP 517 hooks directly (no `build` package, no network); they rewrite sys.argv
(cd "$src" && "$PY" -c 'import sys; out = sys.argv[1]; from setuptools import build_meta as b
names = [b.build_sdist(out), b.build_wheel(out)]; print(*names, sep="\n", file=sys.stderr)' \
    "$DIST") >"$work/build.log" 2>&1 || { cat "$work/build.log" >&2; exit 1; }
tail -n 2 "$work/build.log" | sed 's/^/    /'

step "SBOM of the images"
"$PY" "$HERE/sbom.py" --version "$version" "$work/oci" "$DIST/rukpak-python-$version.spdx.json" |
    sed 's/^/    /'

step "checksums"
(cd "$DIST" && sha256sum rukpak-python-"$version".oci.tar rukpak.yaml rukpak-"$version".tgz \
    rukpak_python-"$version"* rukpak-python-"$version".spdx.json >SHA256SUMS)
echo "$image" >"$DIST/IMAGE"
sed 's/^/    /' "$DIST/SHA256SUMS"
step "done: $DIST (push and sign: hack/release/push.sh $DIST REGISTRY/REPO --key cosign.key)"
