#!/usr/bin/env bash
# Build the node plugin's container image without a container engine, and push it.
#
#   hack/image/build.sh [--insecure HOST:PORT] [--digest-file FILE] REF
#   hack/image/build.sh --oci-layout DIR [--tag TAG]
#
# Two layers:
#   base  Debian bookworm minbase (debootstrap) + packages.txt, security updates, and a
#         venv at /opt/rukpak holding the project's dependencies (wheels fetched or built
#         by the host's pip: the host's CPython 3.11 has the chroot's python3.11 ABI).
#         Cached in ${RUKPAK_CACHE:-~/.cache/rukpak}/image/base-KEY/, KEY = hash of
#         packages.txt, pyproject.toml and BASE_RECIPE below.
#   app   the project's own wheel installed into that venv (`pip install --root`), files
#         dated SOURCE_DATE_EPOCH: rebuilt in seconds when the source tree changes,
#         cached as app-KEY.tar.gz, KEY = hash of the source files that go in the wheel.
# Layers are tar+gzip, sorted, numeric owners, no device nodes (tools: ocitool.py).
# Needs root (debootstrap, chroot) and the repo's venv (make setup) for pip and the
# OCI client. Environment: RUKPAK_CACHE, SUITE (bookworm), MIRROR, SECURITY_MIRROR,
# PYTHON (the host venv's python), NICE (10).
set -euo pipefail

BASE_RECIPE=3 # bump when the base layer's recipe below changes
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$REPO/hack/image
CACHE=${RUKPAK_CACHE:-$HOME/.cache/rukpak}/image
PY=${PYTHON:-$REPO/.venv/bin/python}
SUITE=${SUITE:-bookworm}
EPOCH=315532800 # 1980-01-01: file dates of the app layer (pyc files are hash-checked)
VENV=/opt/rukpak
RUN=(nice -n "${NICE:-10}")
START=$SECONDS

ref="" insecure=() digest_file="" layout_dir="" tag=latest
while (($#)); do
    case $1 in
    --insecure) insecure+=(--insecure "$2"); shift 2 ;;
    --digest-file) digest_file=$2; shift 2 ;;
    --oci-layout) layout_dir=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    -h | --help) sed -n '2,20s/^# \{0,1\}//p' "$0"; exit 0 ;;
    -*) echo "build.sh: unknown flag $1" >&2; exit 2 ;;
    *) ref=$1; shift ;;
    esac
done
if [[ -z $ref && -z $layout_dir ]]; then
    echo "usage: build.sh [--insecure HOST:PORT] [--digest-file FILE] REF | --oci-layout DIR" >&2
    exit 2
fi
[[ $(id -u) == 0 ]] || { echo "build.sh: needs root (debootstrap, chroot)" >&2; exit 1; }
[[ -x $PY ]] || { echo "build.sh: no $PY; run make setup first" >&2; exit 1; }

if ! command -v debootstrap >/dev/null; then
    echo "==> installing debootstrap (apt)"
    apt-get install -y -q debootstrap >/dev/null || { apt-get update -q && apt-get install -y -q debootstrap; }
fi

step() { printf '==> [%4ss] %s\n' "$((SECONDS - START))" "$*"; }

# The Debian mirrors this host's apt uses (deb822 .sources or one-line sources.list).
apt_uris() {
    cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list \
        2>/dev/null | awk '/^URIs:/ {print $2} /^deb / {for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) {print $i; break}}'
}
MIRROR=${MIRROR:-$(apt_uris | grep -E '/debian/?$' | head -n1 || true)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${SECURITY_MIRROR:-$(apt_uris | grep -E '/debian-security/?$' | head -n1 || true)}
SECURITY_MIRROR=${SECURITY_MIRROR:-http://deb.debian.org/debian-security}

packages=$(grep -v '^\s*#' "$HERE/packages.txt" | xargs)
base_key=$(
    {
        echo "recipe=$BASE_RECIPE suite=$SUITE arch=$(uname -m) packages=$packages"
        cat "$REPO/pyproject.toml" "$REPO/hack/pyfuse3/patch.py"
    } | sha256sum | cut -c1-16
)
base=$CACHE/base-$base_key
mkdir -p "$CACHE"

# Unmount whatever a chroot step left mounted under $1 (proc), deepest first.
unmount_under() {
    local root
    root=$(realpath "$1")
    awk -v r="$root" '$5 == r || index($5, r "/") == 1 {print $5}' /proc/self/mountinfo |
        sort -r | while read -r m; do umount "$m" || umount -l "$m"; done
}
in_chroot() { # in_chroot ROOTFS CMD...: with /proc mounted and the host's resolv.conf
    local root=$1
    shift
    mount -t proc proc "$root/proc"
    cp /etc/resolv.conf "$root/etc/resolv.conf"
    local rc=0
    "${RUN[@]}" chroot "$root" /usr/bin/env -i HOME=/root LC_ALL=C.UTF-8 \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        DEBIAN_FRONTEND=noninteractive SOURCE_DATE_EPOCH=$EPOCH "$@" || rc=$?
    rm -f "$root/etc/resolv.conf"
    umount "$root/proc"
    return $rc
}

build_base() {
    local work=$CACHE/base-$base_key.tmp
    [[ -d $work ]] && { unmount_under "$work"; rm -rf "$work"; }
    mkdir -p "$work/wheels"
    trap 'unmount_under "'"$work"'"' EXIT

    step "base: wheels of the dependencies (host pip, CPython $("$PY" -c 'import sys; print(sys.version.split()[0])'))"
    "$PY" -c 'import sys, tomllib; p = tomllib.load(sys.stdin.buffer)["project"]
print(*p["dependencies"], *p["optional-dependencies"]["node"], sep="\n")' \
        <"$REPO/pyproject.toml" >"$work/requirements.txt"
    "${RUN[@]}" "$PY" -m pip wheel --progress-bar off -q -w "$work/wheels" -r "$work/requirements.txt"
    rm -f "$work/wheels"/pyfuse3-*.whl  # FUSE mode wants the patched one (hack/pyfuse3)
    "${RUN[@]}" "$REPO/hack/pyfuse3/build.sh" "$(dirname "$PY")/pip" "$work/wheels" >/dev/null
    ls "$work/wheels" | sed 's/^/      /'

    step "base: debootstrap --variant=minbase $SUITE from $MIRROR (+ $packages)"
    "${RUN[@]}" debootstrap --variant=minbase --components=main \
        --include="${packages// /,}" "$SUITE" "$work/rootfs" "$MIRROR" 2>&1 |
        tee "$work/debootstrap.log" |
        awk '/^I: (Retrieving|Validating|Extracting|Unpacking|Configuring) [a-z0-9]/ {
                 if (n[$2]++ % 20) next; $0 = $0 " ..." }
             /^[IWE]: / {print "      " $0; fflush()}'
    [[ -x $work/rootfs/usr/bin/python3 ]] || { echo "debootstrap made no python3" >&2; exit 1; }

    step "base: security and point-release updates"
    cat >"$work/rootfs/etc/apt/sources.list" <<EOF
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb $SECURITY_MIRROR $SUITE-security main
EOF
    in_chroot "$work/rootfs" sh -c 'apt-get -qq update && apt-get -y -q upgrade && apt-get clean' 2>&1 |
        tee "$work/upgrade.log" |
        awk '/^([0-9]+ upgraded|E: [^C])/ {print "      " $0; fflush()}'

    step "base: venv $VENV with the dependencies"
    mkdir -p "$work/rootfs/tmp/wheels"
    cp "$work/wheels"/*.whl "$work/rootfs/tmp/wheels/"
    in_chroot "$work/rootfs" sh -c "python3 -m venv $VENV && $VENV/bin/pip install -q \
        --no-index --no-cache-dir --disable-pip-version-check /tmp/wheels/*.whl &&
        $VENV/bin/pip list --disable-pip-version-check --format=freeze" | sed 's/^/      /'

    step "base: strip docs, caches, apt lists, logs, device nodes"
    (
        cd "$work/rootfs"
        rm -rf tmp/* var/tmp/* root/.cache usr/share/doc/* usr/share/man/* usr/share/info/* \
            usr/share/lintian usr/share/locale/* var/lib/apt/lists/* var/cache/apt/* \
            var/cache/debconf/*-old var/lib/dpkg/*-old var/cache/ldconfig/aux-cache
        find var/log -type f -delete
        find dev -mindepth 1 -delete
        : >etc/machine-id
        # later apt installs in derived images keep the image small too
        printf '%s\n' 'path-exclude /usr/share/doc/*' 'path-exclude /usr/share/man/*' \
            'path-exclude /usr/share/info/*' 'path-exclude /usr/share/locale/*' \
            >etc/dpkg/dpkg.cfg.d/rukpak-excludes
    )
    step "base: packing the layer ($(du -sh "$work/rootfs" | cut -f1) uncompressed)"
    "${RUN[@]}" "$PY" "$HERE/ocitool.py" layer "$work/rootfs" "$work/base.tar.gz"
    trap - EXIT
    if ! mv -T "$work" "$base" 2>/dev/null; then # built concurrently: keep the first
        rm -rf "$work"
    fi
    for old in "$CACHE"/base-*; do
        [[ $old == "$base" || $old == *.tmp ]] && continue
        step "base: removing the outdated cache $old"
        unmount_under "$old"
        rm -rf "$old"
    done
}

if [[ -f $base/base.tar.gz ]]; then
    step "base: cached ($base)"
else
    build_base
fi

# The files that make the project's wheel, as git sees them (tracked or new, not ignored).
sources() {
    git -C "$REPO" ls-files -z -co --exclude-standard -- pyproject.toml README.md LICENSE \
        rukpak csi provisioner | while IFS= read -r -d '' f; do [[ -f $REPO/$f ]] && printf '%s\0' "$f"; done
}
app_key=$(sources | sort -z | (cd "$REPO" && xargs -0 sha256sum) | sha256sum | cut -c1-16)
app=$CACHE/app-$app_key.tar.gz
if [[ -f $app ]]; then
    step "app: cached ($app)"
else
    step "app: wheel of the project (source tree $app_key)"
    work=$(mktemp -d "$CACHE/app.XXXXXX")
    trap 'rm -rf "'"$work"'"; unmount_under "'"$base"'/rootfs"' EXIT
    mkdir -p "$work/src"
    sources | (cd "$REPO" && tar --null -T - -cf -) | tar -C "$work/src" -xf -
    "${RUN[@]}" "$PY" -m pip wheel -q --no-deps --no-build-isolation -w "$work/dist" "$work/src"
    wheel=$(basename "$work"/dist/*.whl)
    stage=tmp/app-stage
    rm -rf "${base:?}/rootfs/$stage"
    mkdir -p "$base/rootfs/$stage"
    cp "$work/dist/$wheel" "$base/rootfs/tmp/$wheel"
    step "app: pip install --root (into $VENV)"
    in_chroot "$base/rootfs" "$VENV/bin/pip" install -q --no-deps --no-index --no-cache-dir \
        --disable-pip-version-check --no-warn-script-location --root "/$stage" "/tmp/$wheel"
    "${RUN[@]}" "$PY" "$HERE/ocitool.py" layer "$base/rootfs/$stage" "$work/app.tar.gz" --mtime "$EPOCH"
    mv "$work/app.tar.gz" "$app"
    mv "$work/app.json" "${app%.tar.gz}.json"
    rm -rf "${base:?}/rootfs/$stage" "$base/rootfs/tmp/$wheel" "$work"
    trap - EXIT
    ls -t "$CACHE"/app-*.tar.gz | tail -n +6 | while read -r old; do rm -f "$old" "${old%.tar.gz}.json"; done
fi

image_args=(
    --layer "$base/base.tar.gz=debian $SUITE minbase + $packages + $VENV dependencies"
    --layer "$app=rukpak-python (source $app_key)"
    --entrypoint "$VENV/bin/rukpak-csi-plugin"
    --path "$VENV/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    --label "org.opencontainers.image.title=rukpak-python"
    --label "org.opencontainers.image.source=https://github.com/operator-framework/rukpak"
)
if [[ -n $layout_dir ]]; then
    "$PY" "$HERE/ocitool.py" layout "${image_args[@]}" --tag "$tag" "$layout_dir"
fi
if [[ -n $ref ]]; then
    step "push $ref"
    "$PY" "$HERE/ocitool.py" push "${image_args[@]}" "${insecure[@]}" \
        ${digest_file:+--digest-file "$digest_file"} "$ref"
fi
step "done"
