#!/usr/bin/env bash
# `make run`: the project's main job as far as it reaches today, on loopback.
#
# 1. start a throwaway OCI registry (Debian's docker-registry) on a free port;
# 2. build the example bundle examples/bundles/hello for linux/amd64 and
#    linux/arm64 into an OCI layout, and push it;
# 3. inspect what the registry now holds, the way the CSI driver will see it;
# 4. stop the registry (by the pid of the process that runs it) and remove
#    everything it stored.
#
# Unattended: no prompts, exits 0 on success and non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PY="$VENV/bin/python"
RUKPAK="$VENV/bin/rukpak"
BUNDLE=examples/bundles/hello
REGISTRY_BINARY=/usr/bin/docker-registry

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }

for tool in "$PY" "$RUKPAK" "$REGISTRY_BINARY"; do
  if [ ! -x "$tool" ]; then
    echo "run.sh: $tool is missing; run 'make setup' first" >&2
    exit 1
  fi
done

WORK=$(mktemp -d -t rukpak-run.XXXXXX)
SERVER_PID=""
cleanup() {
  local status=$?
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill "$SERVER_PID" 2>/dev/null || true  # it stops the registry, then exits
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  rm -rf "$WORK"
  if [ "$status" -ne 0 ]; then
    echo "run.sh: failed (exit $status); the registry has been stopped" >&2
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

say "Starting a local OCI registry"
# The same helper the tests use (a free loopback port, storage under $WORK),
# kept alive by a small Python process: the registry dies with its parent, and
# SIGTERM to the parent stops it cleanly.
"$PY" - "$WORK/registry" >"$WORK/registry.addr" <<'PY' &
import signal
import sys
from pathlib import Path

from tests.registry import RegistryServer

server = RegistryServer.start(Path(sys.argv[1]))
signal.signal(signal.SIGTERM, lambda *_: (server.stop(), sys.exit(0)))
print(server.host, server.pid, flush=True)
while True:
    signal.pause()
PY
SERVER_PID=$!
for _ in $(seq 300); do
  [ -s "$WORK/registry.addr" ] && break
  kill -0 "$SERVER_PID" 2>/dev/null || { echo "run.sh: the registry did not start" >&2; exit 1; }
  sleep 0.1
done
read -r REGISTRY REGISTRY_PID <"$WORK/registry.addr"
echo "docker-registry (pid $REGISTRY_PID) serves http://$REGISTRY; its log: $(ls "$WORK"/registry/registry-*.log)"

IMAGE="$REGISTRY/examples/hello:v1"

say "Building $BUNDLE for two platforms"
echo "The bundle is a directory whose manifests/ holds Kubernetes objects:"
ls -l "$BUNDLE/manifests"
run "$RUKPAK" bundle build "$BUNDLE" --tag "$IMAGE" \
  --platform linux/amd64,linux/arm64 --output "$WORK/layout"
echo "The OCI layout it wrote (the same files always give the same digests):"
(cd "$WORK/layout" && find . -type f | sort)

say "Pushing it to the registry"
run "$RUKPAK" bundle push "$WORK/layout" --progress

say "Building and pushing again in one step"
echo "Nothing changed, so the digest is the same and every blob is already there:"
run "$RUKPAK" bundle build "$BUNDLE" --tag "$IMAGE" --platform linux/amd64,linux/arm64 --push

say "Inspecting what the registry holds"
run "$RUKPAK" bundle inspect "$IMAGE" --platform linux/arm64

say "Done"
cat <<EOF
What happened:
  - examples/bundles/hello/manifests/ was checked (flat, .yaml files, every
    document a Kubernetes object) and packed into one deterministic tar+gzip layer;
  - one OCI image manifest per platform (linux/amd64, linux/arm64) points at that
    layer, and an OCI index lists both; the index is tagged $IMAGE;
  - 'rukpak bundle inspect' read it back the way the CSI driver pulls bundles:
    resolve the tag, pick the platform's manifest, stream and verify the layer.
Next (not built yet): a Bundle that names this image is mounted into pods as a
read-only CSI volume and its manifests are applied to the cluster.
The registry is being stopped now; nothing is left behind.
EOF
