#!/usr/bin/env bash
# Builds the binaries of the test cluster (tests/cluster/localcluster.py) from upstream
# sources through the Go module proxy: kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, kubectl and etcd from the wrapper module in tests/cluster/go,
# kube-proxy, kubeadm (for the kind node image, tests/kind), csi-sanity from its pinned
# tag, and CoreDNS (static, for the clusters' DNS pod) from the wrapper module in
# tests/cluster/coredns: CoreDNS $COREDNS_VERSION with only the plugins our Corefiles use.
# Output: $RUKPAK_CACHE/bin/<k8s version>/.
#
# A stamp per binary (hash of the module files, the Go version and the flags) makes a second
# run return at once; without it, `go install` relinks only what changed.
# `build.sh [--quiet] [NAME...]` builds the binaries named (default: all); `--print-dir`
# prints the output directory and builds nothing; `--quiet` says nothing when there is
# nothing to build.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MOD="$HERE/go"
K8S_VERSION="$(awk '$1 == "k8s.io/kubernetes" { print $2; exit } $1 == "require" && $2 == "k8s.io/kubernetes" { print $3; exit }' "$MOD/go.mod")"
CSI_TEST_VERSION="v5.6.0"
COREDNS_MOD="$HERE/coredns"
COREDNS_VERSION="$(awk '$1 == "require" && $2 == "github.com/coredns/coredns" { print $3; exit }' "$COREDNS_MOD/go.mod")"
CACHE="${RUKPAK_CACHE:-$HOME/.cache/rukpak}"
OUT="$CACHE/bin/$K8S_VERSION"
BINARIES=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl etcd kube-proxy kubeadm)
MINOR="${K8S_VERSION#v1.}"
MINOR="${MINOR%%.*}"
# Stamp the version as upstream's release build does (hack/lib/version.sh), so that
# `kubectl version`, the Node's kubeletVersion and emulation-version checks see it.
VERSION_X=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    VERSION_X+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$MINOR"
    VERSION_X+=" -X $pkg.gitTreeState=clean"
done
LDFLAGS="-s -w$VERSION_X"

if [[ "${1:-}" == "--print-dir" ]]; then
    echo "$OUT"
    exit 0
fi
QUIET=""
if [[ "${1:-}" == "--quiet" ]]; then
    QUIET=1
    shift
fi
# the binaries asked for (default: all of them); `make run` asks only for what its cluster runs
WANTED=("$@")
((${#WANTED[@]})) || WANTED=("${BINARIES[@]}" csi-sanity coredns)
for b in "${WANTED[@]}"; do
    case " ${BINARIES[*]} csi-sanity coredns " in
    *" $b "*) ;;
    *) echo "k8s-bins: no binary named $b (known: ${BINARIES[*]} csi-sanity coredns)" >&2; exit 2 ;;
    esac
done

stamp() {
    {
        go version
        echo "$LDFLAGS $CSI_TEST_VERSION $COREDNS_VERSION"
        cat "$MOD/go.mod" "$MOD/go.sum"
        find "$MOD/cmd" -name '*.go' -print0 | sort -z | xargs -0 cat
        cat "$COREDNS_MOD/go.mod" "$COREDNS_MOD/go.sum" "$COREDNS_MOD/main.go"
    } | sha256sum | cut -d' ' -f1
}

want="$(stamp)"
mkdir -p "$OUT"
# one build at a time per output directory (parallel test sessions call this too)
exec 9>"$OUT/.lock"
flock 9
# a binary is up to date when it is there and its stamp (.stamp-NAME) is this recipe's
todo=()
for b in "${WANTED[@]}"; do
    if [[ -x "$OUT/$b" && -f "$OUT/.stamp-$b" && "$(cat "$OUT/.stamp-$b")" == "$want" ]]; then
        continue
    fi
    todo+=("$b")
done
if ((${#todo[@]} == 0)); then
    [[ -n $QUIET ]] || echo "k8s-bins: up to date in $OUT (kubernetes $K8S_VERSION)"
    exit 0
fi

start=$SECONDS
echo "k8s-bins: building ${todo[*]} (kubernetes $K8S_VERSION) into $OUT (cold: about 5 minutes on 2 cores)"
module=()
for b in "${todo[@]}"; do
    case " ${BINARIES[*]} " in *" $b "*) module+=("./cmd/$b") ;; esac
done
if ((${#module[@]})); then
    # one go command for all of them: compiles and links overlap on every core
    (cd "$MOD" && GOBIN="$OUT" go install -ldflags="$LDFLAGS" "${module[@]}")
    for m in "${module[@]}"; do echo "$want" >"$OUT/.stamp-${m#./cmd/}"; done
    echo "k8s-bins: [$((SECONDS - start))s] ${module[*]#./cmd/} done"
fi
if [[ " ${todo[*]} " == *" csi-sanity "* ]]; then
    (cd / && GOBIN="$OUT" go install -ldflags="$LDFLAGS" \
        "github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@$CSI_TEST_VERSION")
    echo "$want" >"$OUT/.stamp-csi-sanity"
    echo "k8s-bins: [$((SECONDS - start))s] csi-sanity $CSI_TEST_VERSION done"
fi
if [[ " ${todo[*]} " == *" coredns "* ]]; then
    (cd "$COREDNS_MOD" && CGO_ENABLED=0 GOBIN="$OUT" go install -ldflags="-s -w" .)
    echo "$want" >"$OUT/.stamp-coredns"
    echo "k8s-bins: [$((SECONDS - start))s] coredns $COREDNS_VERSION done"
fi
echo "k8s-bins: built in $((SECONDS - start))s in $OUT"
