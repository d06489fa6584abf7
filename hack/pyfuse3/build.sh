#!/usr/bin/env bash
# Build pyfuse3 3.5.0 with hack/pyfuse3/patch.py applied into a wheel: hack/pyfuse3/build.sh PIP OUTDIR
# PIP is the pip to use (it downloads the sdist from PyPI and compiles it; needs libfuse3-dev,
# pkg-config, gcc). Prints the wheel's path. Why the patch: see patch.py and csi/fuse/fs.py.
set -euo pipefail
pip=$1
out=$2
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# --no-binary for pyfuse3 alone: with :all:, preparing the sdist's metadata would also
# build its build requirements (Cython) from source, about 140 s of compiling on 2 cores
"$pip" download -q --no-deps --no-binary pyfuse3 -d "$work" pyfuse3==3.5.0
tar -xzf "$work"/pyfuse3-3.5.0.tar.gz -C "$work"
"$(dirname "$pip")/python" "$here/patch.py" "$work/pyfuse3-3.5.0"
mkdir -p "$out"
"$pip" wheel -q --no-deps --no-build-isolation -w "$out" "$work/pyfuse3-3.5.0"
ls "$out"/pyfuse3-3.5.0+rukpak.inodehandles-*.whl
