#!/usr/bin/env bash
# Builds the `helm` binary the helm provisioner (contrib/helm-provisioner) runs, from its Go
# module through the Go module proxy (`go install helm.sh/helm/v3/cmd/helm@VERSION`), cached
# in $RUKPAK_CACHE/bin/helm-VERSION/helm (default ~/.cache/rukpak) like the Kubernetes
# binaries (tests/cluster/build.sh). Called by `make helm` (part of `make test`'s set-up) and
# by the helm provisioner's image build. A stamp (Go version, helm version, flags) makes a
# second run return at once. Cold build: about 90 s on 2 cores.
#
#   hack/helm.sh [--print-path] [--quiet]
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.16.4}"
CACHE="${RUKPAK_CACHE:-$HOME/.cache/rukpak}"
OUT="$CACHE/bin/helm-$HELM_VERSION"
# Stamp the version as helm's Makefile does, so `helm version` tells what it is.
LDFLAGS="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
LDFLAGS+=" -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
quiet=0
case "${1:-}" in
--print-path) echo "$OUT/helm"; exit 0 ;;
--quiet) quiet=1 ;;
"") ;;
*) echo "usage: hack/helm.sh [--print-path] [--quiet]" >&2; exit 2 ;;
esac

command -v go >/dev/null || { echo "hack/helm.sh: no go on PATH (make k8s-bins needs it too)" >&2; exit 1; }
want="$( { go version; echo "$HELM_VERSION $LDFLAGS CGO_ENABLED=0"; } | sha256sum | cut -d' ' -f1)"
mkdir -p "$OUT"
exec 9>"$OUT/.lock" # one build at a time (parallel sessions call this too)
flock 9
if [[ -x "$OUT/helm" && -f "$OUT/.stamp" && "$(cat "$OUT/.stamp")" == "$want" ]]; then
    ((quiet)) || echo "helm: up to date ($OUT/helm, $HELM_VERSION)"
    exit 0
fi
rm -f "$OUT/.stamp"
start=$SECONDS
echo "helm: building $HELM_VERSION into $OUT (cold: about 90 s on 2 cores)"
# CGO off: a static binary that runs in any image, whatever its libc
(cd / && CGO_ENABLED=0 GOBIN="$OUT" go install -ldflags="$LDFLAGS" \
    "helm.sh/helm/v3/cmd/helm@$HELM_VERSION")
"$OUT/helm" version --short >/dev/null
echo "$want" >"$OUT/.stamp"
echo "helm: built in $((SECONDS - start))s: $("$OUT/helm" version --short)"
