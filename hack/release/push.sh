#!/usr/bin/env bash
# Push a release's image (the OCI layout archive `make release` wrote to dist/) to any
# registry, and sign it there with `rukpak bundle sign` (a signature cosign verifies:
# `cosign verify --key cosign.pub --insecure-ignore-tlog REPO@DIGEST`).
#
#   hack/release/push.sh [--insecure HOST:PORT] [--key cosign.key] [--format bundle|simple-signing]
#                        [--digest-file F] DIST REPO
#
# The index goes to REPO:VERSION (VERSION read from the archive's name); every
# per-architecture manifest by digest before it. Prints REPO@DIGEST. The digest is the
# one dist/rukpak.yaml and the chart pin, wherever REPO is: install from another
# repository with `helm install --set image.repository=REPO`, or rewrite rukpak.yaml's
# image name (its digest stays). An encrypted key's password comes from COSIGN_PASSWORD.
set -euo pipefail
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PY=${PYTHON:-$REPO_ROOT/.venv/bin/python}
insecure=() key="" format=bundle digest_file="" args=()
while (($#)); do
    case $1 in
    --insecure) insecure+=(--insecure "$2"); shift 2 ;;
    --key) key=$2; shift 2 ;;
    --format) format=$2; shift 2 ;;
    --digest-file) digest_file=$2; shift 2 ;;
    -h | --help) sed -n '2,14s/^# \{0,1\}//p' "$0"; exit 0 ;;
    -*) echo "push.sh: unknown flag $1" >&2; exit 2 ;;
    *) args+=("$1"); shift ;;
    esac
done
((${#args[@]} == 2)) || { echo "usage: push.sh [--insecure H:P] [--key KEY] DIST REPO" >&2; exit 2; }
dist=${args[0]} repo=${args[1]}
archives=("$dist"/rukpak-python-*.oci.tar)
[[ -f ${archives[0]} && ${#archives[@]} == 1 ]] ||
    { echo "push.sh: want exactly one rukpak-python-VERSION.oci.tar in $dist" >&2; exit 1; }
version=$(basename "${archives[0]}" .oci.tar)
version=${version#rukpak-python-}
if [[ -f $dist/SHA256SUMS ]]; then
    (cd "$dist" && sha256sum --quiet --check --ignore-missing SHA256SUMS) ||
        { echo "push.sh: $dist does not match its SHA256SUMS" >&2; exit 1; }
fi
pushed=$(PYTHONPATH=$REPO_ROOT "$PY" "$REPO_ROOT/hack/release/ocindex.py" push \
    "${insecure[@]}" "${archives[0]}" "$repo:$version")
echo "$pushed"
[[ -z $digest_file ]] || echo "${pushed#*@}" >"$digest_file"
if [[ -n $key ]]; then
    PYTHONPATH=$REPO_ROOT "$PY" -m provisioner.cli.main bundle sign --key "$key" --format "$format" \
        ${insecure[@]:+--insecure} "$pushed"
fi
