#!/usr/bin/env bash
# Builds estargz-check (tests/estargz/go: the eStargz reference reader,
# github.com/containerd/stargz-snapshotter/estargz, fetched through the Go module proxy)
# into $RUKPAK_CACHE/bin/estargz-check and prints its path. A stamp (hash of the module
# files and the Go version) makes a second run return at once.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
MOD="$HERE/go"
CACHE="${RUKPAK_CACHE:-$HOME/.cache/rukpak}"
OUT="$CACHE/bin/estargz-check"
STAMP="$OUT.stamp"

want="$( { go version; cat "$MOD/go.mod" "$MOD/go.sum" "$MOD/main.go"; } | sha256sum | cut -d' ' -f1)"
if [[ -x "$OUT" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
    echo "$OUT"
    exit 0
fi
mkdir -p "$(dirname "$OUT")"
(cd "$MOD" && go build -trimpath -ldflags "-s -w" -o "$OUT.tmp" .) >&2
mv "$OUT.tmp" "$OUT"
echo "$want" > "$STAMP"
echo "$OUT"
