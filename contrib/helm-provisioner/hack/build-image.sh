#!/usr/bin/env bash
# Build the helm provisioner's image without a container engine, and push it:
# the RukPak image (hack/image/build.sh: Debian + the venv /opt/rukpak with RukPak)
# plus one layer holding /opt/rukpak/bin/helm (hack/helm.sh, built from its Go module,
# cached) and this package (rukpak_helm) installed into that venv.
#
#   contrib/helm-provisioner/hack/build-image.sh [--insecure HOST:PORT] [--digest-file FILE] REF
#
# Entrypoint: /opt/rukpak/bin/python -m rukpak_helm. Needs what hack/image/build.sh
# needs (root, the repo's venv). Environment: RUKPAK_CACHE, PYTHON.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
REPO=$(cd "$HERE/../.." && pwd)
PY=${PYTHON:-$REPO/.venv/bin/python}
OCITOOL=$REPO/hack/image/ocitool.py
VENV=/opt/rukpak
EPOCH=315532800 # as hack/image/build.sh: file dates of the layer
START=$SECONDS

ref="" insecure=() digest_file=""
while (($#)); do
    case $1 in
    --insecure) insecure+=(--insecure "$2"); shift 2 ;;
    --digest-file) digest_file=$2; shift 2 ;;
    -h | --help) sed -n '2,11s/^# \{0,1\}//p' "$0"; exit 0 ;;
    -*) echo "build-image.sh: unknown flag $1" >&2; exit 2 ;;
    *) ref=$1; shift ;;
    esac
done
[[ -n $ref ]] || { echo "usage: build-image.sh [--insecure HOST:PORT] [--digest-file FILE] REF" >&2; exit 2; }
step() { printf '==> [%4ss] %s\n' "$((SECONDS - START))" "$*"; }

work=$(mktemp -d "${TMPDIR:-/tmp}/rukpak-helm-image.XXXXXX")
trap 'rm -rf "$work"' EXIT

step "the RukPak image's layers (hack/image/build.sh, cached)"
bash "$REPO/hack/image/build.sh" --oci-layout "$work/core" | sed 's/^/      /'

step "helm (hack/helm.sh, cached)"
bash "$REPO/hack/helm.sh"
helm=$(bash "$REPO/hack/helm.sh" --print-path)

step "the helm provisioner's layer: helm + rukpak_helm"
pyver=$("$PY" -c 'import sys; print(f"python{sys.version_info[0]}.{sys.version_info[1]}")')
stage=$work/stage
mkdir -p "$stage$VENV/bin"
install -m 0755 "$helm" "$stage$VENV/bin/helm"
"$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$work/dist" "$HERE"
"$PY" -m pip install -q --no-deps --no-compile --no-warn-script-location \
    --target "$stage$VENV/lib/$pyver/site-packages" "$work"/dist/*.whl
rm -rf "$stage$VENV/lib/$pyver/site-packages/bin" # scripts with the host's shebang
"$PY" "$OCITOOL" layer "$stage" "$work/helm.tar.gz" --mtime "$EPOCH"

# The core image's layers as ocitool inputs: each blob with its descriptor beside it.
layers=$("$PY" - "$work/core" <<'EOF'
import json, os, sys
root = sys.argv[1]
blob = lambda d: os.path.join(root, "blobs", "sha256", d.split(":", 1)[1])
index = json.load(open(os.path.join(root, "index.json")))
manifest = json.load(open(blob(index["manifests"][0]["digest"])))
config = json.load(open(blob(manifest["config"]["digest"])))
for i, (layer, diff_id) in enumerate(zip(manifest["layers"], config["rootfs"]["diff_ids"])):
    base = os.path.join(root, f"layer{i}")
    os.symlink(blob(layer["digest"]), base + ".tar.gz")
    json.dump({**layer, "diff_id": diff_id}, open(base + ".json", "w"))
    comment = config["history"][i].get("created_by", "").removeprefix("hack/image/build.sh: ")
    print(f"{base}.tar.gz={comment}")
EOF
)
args=()
while IFS= read -r layer; do args+=(--layer "$layer"); done <<<"$layers"
args+=(
    --layer "$work/helm.tar.gz=helm $(basename "$(dirname "$helm")") + rukpak_helm"
    --entrypoint "$VENV/bin/python -m rukpak_helm"
    --path "$VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    --label "org.opencontainers.image.title=rukpak-helm-provisioner"
)
step "push $ref"
"$PY" "$OCITOOL" push "${args[@]}" "${insecure[@]}" ${digest_file:+--digest-file "$digest_file"} "$ref"
step "done"
