#!/usr/bin/env bash
# `make manifests [IMAGE=REF]`: render deploy/ into one YAML file for releases.
#
#   hack/manifests.sh [--image REPO:TAG|REPO@sha256:...] [--output FILE]
#
# The file (default dist/rukpak.yaml) is what `kubectl apply -k deploy/` applies, with
# the image set when --image is given (through a throwaway overlay's `images:` entry,
# the one place the image is pinned). kubectl comes from `make k8s-bins` or PATH.
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
image="" output=$REPO/dist/rukpak.yaml
while (($#)); do
    case $1 in
    --image) image=$2; shift 2 ;;
    --output) output=$2; shift 2 ;;
    -h | --help) sed -n '2,9s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "manifests.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
PY=${PYTHON:-$REPO/.venv/bin/python}
kubectl=$(cd "$REPO" && "$PY" -c 'from tests.cluster import bins; print(bins.find("kubectl") or "")' 2>/dev/null || true)
kubectl=${kubectl:-$(command -v kubectl || true)}
[[ -n $kubectl ]] || { echo "manifests.sh: no kubectl; run 'make k8s-bins' or install kubectl" >&2; exit 1; }

target=$REPO/deploy
if [[ -n $image ]]; then
    overlay=$(mktemp -d "$REPO/.manifests.XXXXXX")
    trap 'rm -rf "$overlay"' EXIT
    if [[ $image == *@* ]]; then
        pin="newName: ${image%@*}"$'\n'"    digest: ${image#*@}"
    elif [[ ${image##*/} == *:* ]]; then
        pin="newName: ${image%:*}"$'\n'"    newTag: ${image##*:}"
    else
        echo "manifests.sh: --image wants REPO:TAG or REPO@sha256:..., not $image" >&2
        exit 2
    fi
    cat >"$overlay/kustomization.yaml" <<YAML
resources: [../deploy]
images:
  - name: rukpak-python
    $pin
YAML
    target=$overlay
fi
mkdir -p "$(dirname "$output")"
{
    echo "# RukPak: rendered from deploy/ by hack/manifests.sh (make manifests). Apply with"
    echo "#   kubectl apply -f $(basename "$output")"
    "$kubectl" kustomize "$target"
} >"$output.tmp"
mv "$output.tmp" "$output"
echo "wrote $output ($(grep -c '^kind:' "$output") objects, image: $(grep -m1 -o 'image: .*rukpak-python.*' "$output" | cut -d' ' -f2))"
