#!/usr/bin/env bash
# Builds a pinned Go tool from its module through the Go module proxy (`go install
# MODULE/cmd/NAME@VERSION`, static), cached in $RUKPAK_CACHE/bin/NAME-VERSION/NAME (default
# ~/.cache/rukpak) like the Kubernetes binaries (tests/cluster/build.sh). A stamp (Go
# version, tool version, flags) makes a second run return at once. The tools:
#
#   helm    the helm provisioner's renderer (contrib/helm-provisioner); cold: about 90 s
#   cosign  signs and verifies test bundles in the signature tests; cold: about 140 s
#   cosign3 today's cosign (Sigstore bundles as OCI referrers), for the same tests
#   kind    runs the system on a kind cluster (make kind-run, hack/kind); cold: about 60 s
#   kustomize renders deploy/ for releases (make release, hack/release) without building
#             Kubernetes; cold: about a minute
#   promtool  checks and unit-tests the monitoring rules (make promtool, tests/test_monitoring_rules.py);
#             cold: minutes (Prometheus is a large module)
#   tsa     sigstore's RFC 3161 timestamp authority (timestamp-server), for the signature
#           timestamp tests (tests/test_signing_timestamps.py); cold: about a minute. v2.0.6:
#           v2.1.x needs a newer Go than this machine's
#
#   hack/gotool.sh NAME [--print-path] [--quiet]
set -euo pipefail

name="${1:-}"
shift || true
case "$name" in
helm)
    VERSION="${HELM_VERSION:-v3.16.4}"
    PACKAGE="helm.sh/helm/v3/cmd/helm"
    # Stamp the version as helm's Makefile does, so `helm version` tells what it is.
    LDFLAGS="-s -w -X helm.sh/helm/v3/internal/version.version=$VERSION"
    LDFLAGS+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
    CHECK=(version --short)
    COLD="about 90 s"
    ;;
cosign)
    VERSION="${COSIGN_VERSION:-v2.6.5}"
    PACKAGE="github.com/sigstore/cosign/v2/cmd/cosign"
    LDFLAGS="-s -w -X sigs.k8s.io/release-utils/version.gitVersion=$VERSION"
    CHECK=(version --json)
    COLD="about 140 s"
    ;;
cosign3)
    VERSION="${COSIGN3_VERSION:-v3.1.3}"
    PACKAGE="github.com/sigstore/cosign/v3/cmd/cosign"
    LDFLAGS="-s -w -X sigs.k8s.io/release-utils/version.gitVersion=$VERSION"
    CHECK=(version --json)
    COLD="a few minutes"
    BIN=cosign
    ;;
kind)
    VERSION="${KIND_VERSION:-v0.33.0}"
    PACKAGE="sigs.k8s.io/kind"
    LDFLAGS="-s -w"
    CHECK=(version)
    COLD="about 60 s"
    ;;
kustomize)
    VERSION="${KUSTOMIZE_VERSION:-v5.7.1}"
    PACKAGE="sigs.k8s.io/kustomize/kustomize/v5"
    LDFLAGS="-s -w -X sigs.k8s.io/kustomize/api/provenance.version=$VERSION"
    CHECK=(version)
    COLD="about a minute"
    ;;
promtool)
    # Prometheus tags its Go module v0.X.Y for release 3.X.Y (v0.316.0 is not a Go-module
    # semver for 3.16: the module path has no /v3), so the version here is the module's.
    VERSION="${PROMTOOL_VERSION:-v0.316.0}"
    PACKAGE="github.com/prometheus/prometheus/cmd/promtool"
    LDFLAGS="-s -w -X github.com/prometheus/common/version.Version=$VERSION"
    CHECK=(--version)
    COLD="several minutes"
    ;;
tsa)
    VERSION="${TSA_VERSION:-v2.0.6}"
    PACKAGE="github.com/sigstore/timestamp-authority/v2/cmd/timestamp-server"
    LDFLAGS="-s -w"
    CHECK=(--help)
    COLD="about a minute"
    BIN=timestamp-server
    ;;
*) echo "usage: hack/gotool.sh helm|cosign|cosign3|kind|kustomize|promtool|tsa [--print-path] [--quiet]" >&2; exit 2 ;;
esac
BIN="${BIN:-$name}" # the file go install writes
CACHE="${RUKPAK_CACHE:-$HOME/.cache/rukpak}"
OUT="$CACHE/bin/$name-$VERSION"
quiet=0
case "${1:-}" in
--print-path) echo "$OUT/$BIN"; exit 0 ;;
--quiet) quiet=1 ;;
"") ;;
*) echo "usage: hack/gotool.sh $name [--print-path] [--quiet]" >&2; exit 2 ;;
esac

command -v go >/dev/null || { echo "hack/gotool.sh: no go on PATH (make k8s-bins needs it too)" >&2; exit 1; }
want="$( { go version; echo "$VERSION $LDFLAGS CGO_ENABLED=0"; } | sha256sum | cut -d' ' -f1)"
mkdir -p "$OUT"
exec 9>"$OUT/.lock" # one build at a time (parallel sessions call this too)
flock 9
if [[ -x "$OUT/$BIN" && -f "$OUT/.stamp" && "$(cat "$OUT/.stamp")" == "$want" ]]; then
    ((quiet)) || echo "$name: up to date ($OUT/$BIN, $VERSION)"
    exit 0
fi
rm -f "$OUT/.stamp"
start=$SECONDS
echo "$name: building $VERSION into $OUT (cold: $COLD on 2 cores)"
# CGO off: a static binary that runs in any image, whatever its libc
(cd / && CGO_ENABLED=0 GOBIN="$OUT" go install -ldflags="$LDFLAGS" "$PACKAGE@$VERSION")
"$OUT/$BIN" "${CHECK[@]}" >/dev/null
echo "$want" >"$OUT/.stamp"
echo "$name: built in $((SECONDS - start))s ($VERSION)"
