#!/usr/bin/env bash
# Build the node plugin's container image without a container engine, and push it.
#
#   hack/image/build.sh [--arch ARCH] [--insecure HOST:PORT] [--digest-file FILE] REF
#   hack/image/build.sh [--arch ARCH] --oci-layout DIR [--tag TAG]
#
# --arch amd64|arm64 (default: the host's). Another architecture than the host's runs its
# chroot steps under qemu-user-static through binfmt_misc (installed and registered when
# missing); its dependency wheels are the PyPI wheels for that platform (pip download
# --platform), and pyfuse3, which has none, is compiled inside the chroot and its
# compiler removed again. Each architecture has its own cached base layer.
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

BASE_RECIPE=4 # bump when the base layer's recipe below changes
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$REPO/hack/image
CACHE=${RUKPAK_CACHE:-$HOME/.cache/rukpak}/image
PY=${PYTHON:-$REPO/.venv/bin/python}
SUITE=${SUITE:-bookworm}
EPOCH=315532800 # 1980-01-01: file dates of the app layer (pyc files are hash-checked)
VENV=/opt/rukpak
RUN=(nice -n "${NICE:-10}")
START=$SECONDS

ref="" insecure=() digest_file="" layout_dir="" tag=latest arch=""
while (($#)); do
    case $1 in
    --insecure) insecure+=(--insecure "$2"); shift 2 ;;
    --digest-file) digest_file=$2; shift 2 ;;
    --oci-layout) layout_dir=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --arch) arch=$2; shift 2 ;;
    -h | --help) sed -n '2,27s/^# \{0,1\}//p' "$0"; exit 0 ;;
    -*) echo "build.sh: unknown flag $1" >&2; exit 2 ;;
    *) ref=$1; shift ;;
    esac
done
if [[ -z $ref && -z $layout_dir ]]; then
    echo "usage: build.sh [--insecure HOST:PORT] [--digest-file FILE] REF | --oci-layout DIR" >&2
    exit 2
fi
[[ $(id -u) == 0 ]] || { echo "build.sh: needs root (debootstrap, chroot)" >&2; exit 1; }
declare -A DEB_TO_UNAME=([amd64]=x86_64 [arm64]=aarch64)
HOST_ARCH=$(dpkg --print-architecture)
arch=${arch:-$HOST_ARCH}
[[ -n ${DEB_TO_UNAME[$arch]:-} ]] || { echo "build.sh: --arch wants amd64 or arm64, not $arch" >&2; exit 2; }
FOREIGN=""
# another architecture's layers are cached in a directory of their own
[[ $arch == "$HOST_ARCH" ]] || { FOREIGN=1; CACHE=$CACHE/$arch; }
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
        echo "recipe=$BASE_RECIPE suite=$SUITE arch=${DEB_TO_UNAME[$arch]} packages=$packages"
        # another architecture's steps (foreign_wheels, chroot_pyfuse3): their own recipe
        [[ -z $FOREIGN ]] || echo "foreign-recipe=2"
        cat "$REPO/pyproject.toml" "$REPO/hack/pyfuse3/patch.py"
    } | sha256sum | cut -c1-16
)
base=$CACHE/base-$base_key
mkdir -p "$CACHE"
# one build at a time per cache: make test runs two pytest processes side by side, and
# make run builds in the background; both steps below reuse fixed paths under $CACHE
exec 8>"$CACHE/.lock"
flock 8

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

# A foreign architecture's binaries run under qemu-user-static, registered with binfmt_misc's
# F flag (the interpreter is opened once, so it works inside the chroot too).
ensure_binfmt() {
    local name=qemu-${DEB_TO_UNAME[$arch]}
    if [[ ! -e /proc/sys/fs/binfmt_misc/register ]]; then
        mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
    fi
    if [[ ! -f /usr/lib/binfmt.d/$name.conf ]]; then
        step "base: installing qemu-user-static (apt) to run $arch binaries"
        apt-get install -y -q qemu-user-static >/dev/null ||
            { apt-get update -q && apt-get install -y -q qemu-user-static >/dev/null; }
    fi
    [[ -e /proc/sys/fs/binfmt_misc/$name ]] || cat "/usr/lib/binfmt.d/$name.conf" >/proc/sys/fs/binfmt_misc/register
}

# The dependencies' wheels for a foreign architecture: PyPI's manylinux wheels for it (glibc
# up to bookworm's 2.36), pyfuse3 excepted (its patched sdist is compiled in the chroot).
foreign_wheels() {
    local work=$1 plats=() v
    for v in 17 26 27 28 31 34 35 36; do plats+=(--platform "manylinux_2_${v}_${DEB_TO_UNAME[$arch]}"); done
    "${RUN[@]}" "$PY" -m pip download --progress-bar off -q --only-binary=:all: "${plats[@]}" \
        --platform "manylinux2014_${DEB_TO_UNAME[$arch]}" --python-version 3.11 --implementation cp \
        -d "$work/wheels" -r "$work/requirements-binary.txt"
    # bookworm's setuptools (66) cannot read pyfuse3's pyproject.toml: a newer one builds it
    "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$work/build-wheels" \
        "setuptools>=77"
    mkdir -p "$work/pyfuse3-src"
    "$PY" -m pip download -q --no-deps --no-binary pyfuse3 -d "$work/pyfuse3-src" pyfuse3==3.5.0  # not :all: (hack/pyfuse3/build.sh)
    tar -xzf "$work"/pyfuse3-src/pyfuse3-3.5.0.tar.gz -C "$work/pyfuse3-src"
    "$PY" "$REPO/hack/pyfuse3/patch.py" "$work/pyfuse3-src/pyfuse3-3.5.0"
}

# pyfuse3 for a foreign architecture, compiled in the chroot (under qemu) with the compiler
# and headers installed for it and purged afterwards; the wheel lands in /tmp/wheels.
chroot_pyfuse3() {
    local work=$1 build
    build="gcc libc6-dev libfuse3-dev pkg-config python3-dev"
    cp -r "$work/pyfuse3-src/pyfuse3-3.5.0" "$work/rootfs/tmp/pyfuse3-3.5.0"
    cp -r "$work/build-wheels" "$work/rootfs/tmp/build-wheels"
    # every package the compiler brings is purged afterwards: the list before it is kept
    in_chroot "$work/rootfs" sh -c "dpkg-query -W -f='\${Package}\n' | sort >/tmp/packages-before &&
        apt-get -qq update && apt-get install -y -q --no-install-recommends \
        $build >/dev/null && python3 -m venv /tmp/pyfuse3-venv &&
        /tmp/pyfuse3-venv/bin/pip install -q --no-index --disable-pip-version-check \
            /tmp/build-wheels/*.whl &&
        /tmp/pyfuse3-venv/bin/pip wheel -q --no-deps --no-build-isolation -w /tmp/wheels \
            /tmp/pyfuse3-3.5.0 &&
        dpkg-query -W -f='\${Package}\n' | sort >/tmp/packages-after &&
        comm -13 /tmp/packages-before /tmp/packages-after | xargs apt-get purge -y -q >/dev/null &&
        rm -rf /tmp/pyfuse3-venv /tmp/pyfuse3-3.5.0 /tmp/build-wheels /tmp/packages-*" |
        sed 's/^/      /'
}

build_base() {
    local work=$CACHE/base-$base_key.tmp
    [[ -d $work ]] && { unmount_under "$work"; rm -rf "$work"; }
    mkdir -p "$work/wheels"
    trap 'unmount_under "'"$work"'"' EXIT

    step "base: wheels of the dependencies for $arch (host pip, CPython $("$PY" -c 'import sys; print(sys.version.split()[0])'))"
    "$PY" -c 'import sys, tomllib; p = tomllib.load(sys.stdin.buffer)["project"]
print(*p["dependencies"], *p["optional-dependencies"]["node"], sep="\n")' \
        <"$REPO/pyproject.toml" >"$work/requirements.txt"
    # pyfuse3 has no wheels: FUSE mode wants it patched (hack/pyfuse3), built apart below
    grep -v '^pyfuse3' "$work/requirements.txt" >"$work/requirements-binary.txt"
    if [[ -n $FOREIGN ]]; then
        ensure_binfmt
        foreign_wheels "$work"
    else
        "${RUN[@]}" "$PY" -m pip wheel --progress-bar off -q -w "$work/wheels" -r "$work/requirements-binary.txt"
        "${RUN[@]}" "$REPO/hack/pyfuse3/build.sh" "$(dirname "$PY")/pip" "$work/wheels" >/dev/null
    fi
    ls "$work/wheels" | sed 's/^/      /'

    step "base: debootstrap --variant=minbase $SUITE from $MIRROR (+ $packages)"
    "${RUN[@]}" debootstrap --arch="$arch" --variant=minbase --components=main \
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
    if [[ -n $FOREIGN ]]; then
        step "base: pyfuse3 compiled for $arch in the chroot"
        chroot_pyfuse3 "$work"
        cp "$work/rootfs/tmp/wheels"/pyfuse3-*.whl "$work/wheels/"
    fi
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
    step "base: trimming what the plugin, manager and provisioners never import"
    trim_base "$work/rootfs" "$work/aside"
    step "base: packing the layer ($(du -sh "$work/rootfs" | cut -f1) uncompressed)"
    "${RUN[@]}" "$PY" "$HERE/ocitool.py" layer "$work/rootfs" "$work/base.tar.gz"
    # pip stays in the cached root (not in the layer): the app step installs with it
    cp -a "$work/aside/." "$work/rootfs/"
    rm -rf "$work/aside"
    trap - EXIT
    if ! mv -T "$work" "$base" 2>/dev/null; then # built concurrently: keep the first
        rm -rf "$work"
    fi
    # keep the KEEP_BASES most recently used (a test builds the previous release's image,
    # whose dependencies differ: removing every other base would rebuild both each run)
    local kept=0 old
    while IFS= read -r old; do
        [[ $old == "$base" || $old == *.tmp ]] && continue
        kept=$((kept + 1))
        ((kept < ${KEEP_BASES:-2})) && continue
        step "base: removing the least recently used cache $old"
        unmount_under "$old"
        rm -rf "$old"
    done < <(ls -1dt "$CACHE"/base-* 2>/dev/null)
}

# trim_base ROOTFS ASIDE: leave out of the base layer what nothing in the image imports,
# measured on the layer (121 MB compressed before):
# - kubernetes.aio, the client's asyncio twin (68 MB), and aiohttp with the packages only it
#   needs; dulwich's and prometheus_client's aiohttp adapters (never imported here);
# - zstandard's cffi backend (the C backend is the one imported);
# - debug symbols of the extension modules (strip --strip-unneeded, this architecture only);
# - pip and setuptools, moved to ASIDE: put back into the cached root after packing, since the
#   app step installs the project's wheel with that pip.
trim_base() {
    local root=$1 aside=$2 site
    site=$(echo "$root$VENV"/lib/python3*/site-packages)
    [[ -d $site ]] || { echo "trim_base: no site-packages under $root$VENV" >&2; return 1; }
    rm -rf "$site"/kubernetes/aio "$site"/dulwich/aiohttp "$site"/prometheus_client/aiohttp \
        "$site"/zstandard/_cffi.*.so
    local pkg
    for pkg in aiohttp aiohttp_retry aiosignal aiohappyeyeballs frozenlist multidict propcache yarl; do
        rm -rf "${site:?}/$pkg" "$site/$pkg"-*.dist-info
    done
    # nothing left may import what was removed (a new dependency that needs it fails here)
    local left
    left=$(grep -rlE --include='*.py' \
        '^[[:space:]]*(import|from) (aiohttp|aiohttp_retry|yarl|multidict|aiosignal|frozenlist|propcache|aiohappyeyeballs)([ .]|$)' \
        "$site" || true)
    if [[ -n $left ]]; then
        echo "trim_base: still importing a removed package (a new dependency needs it):" >&2
        echo "$left" >&2
        return 1
    fi
    if [[ -z $FOREIGN ]] && command -v strip >/dev/null; then
        find "$site" -name '*.so' -type f -exec strip --strip-unneeded {} +
    fi
    mkdir -p "$aside$VENV/bin" "${aside}${site#"$root"}"
    local p
    for p in "$site"/pip "$site"/pip-*.dist-info "$site"/setuptools "$site"/setuptools-*.dist-info \
        "$site"/_distutils_hack "$site"/distutils-precedence.pth "$root$VENV"/bin/pip*; do
        [[ -e $p ]] && mv "$p" "$aside${p#"$root"}"
    done
    return 0
}

if [[ -f $base/base.tar.gz ]]; then
    step "base: cached ($base)"
    touch "$base" # most recently used
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
    --arch "$arch"
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
