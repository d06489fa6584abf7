#!/usr/bin/env bash
# One-time set-up for a fresh machine, called by `make test`, `make run` and friends.
# Installs the Debian packages the tests and the node plugin need (only those missing),
# then a virtualenv with the project and its dev tools. Safe to run again: it does
# nothing when everything is present.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  docker-registry      # the real OCI registry (distribution v2) the tests start
  apache2-utils        # htpasswd, for the registry's basic-auth mode
  containerd runc containernetworking-plugins iptables conntrack socat ethtool  # kubelet's node
  busybox-static       # the local test and pause images are built from it
  libfuse3-dev fuse3 pkg-config  # pyfuse3 builds from source
  curl zstd            # benchmark baseline and zstd layers
  openssl iproute2 util-linux  # test PKI, the node bridge, mount/flock
  debootstrap          # the node plugin image (hack/image/build.sh), no container engine
  git openssh-server   # git sources: git http-backend and sshd servers the tests start
  zsh fish             # the CLI's completion scripts are run by each shell they are for
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo ">> installing Debian packages: ${missing[*]}"
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
stamp="$VENV/.installed"
if [ ! -x "$VENV/bin/python" ]; then
  echo ">> creating virtualenv $VENV"
  "$PY" -m venv "$VENV"
fi
stale=""
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  stale=1
  echo ">> installing Python dependencies into $VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  # the node extra's pyfuse3 comes after, patched: installing it here would compile it twice
  "$VENV/bin/pip" install -q -e '.[dev]'
fi
# pyfuse3 with the inode-handle patch (hack/pyfuse3): FUSE mode's warm reads stay in the kernel.
if ! "$VENV/bin/python" -c 'import importlib.metadata as m, sys
sys.exit(not m.version("pyfuse3").endswith("+rukpak.inodehandles"))' 2>/dev/null; then
  echo ">> building pyfuse3 3.5.0 with hack/pyfuse3/patch.py"
  wheels=$(mktemp -d)
  hack/pyfuse3/build.sh "$VENV/bin/pip" "$wheels" >/dev/null
  "$VENV/bin/pip" install -q --no-deps --force-reinstall "$wheels"/pyfuse3-*.whl
  rm -rf "$wheels"
fi
if [ -n "$stale" ]; then
  # the rest of the node extra (pyfuse3 is there, 3.5.0+rukpak.inodehandles satisfies ==3.5.0)
  "$VENV/bin/pip" install -q -e '.[dev,node]'
  touch "$stamp"
fi
