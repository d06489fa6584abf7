#!/usr/bin/env bash
# `make run`: the project's main job, end to end, on loopback.
#
# Part 1, bundles (no cluster needed):
#  1. start a throwaway OCI registry (Debian's docker-registry) on a free port;
#  2. build the example bundle examples/bundles/hello for linux/amd64 and
#     linux/arm64 into an OCI layout, and push it;
#  3. inspect what the registry now holds, the way the CSI driver will see it.
# Part 2, the cluster (without KUBECONFIG):
#  4. start a single-node Kubernetes (tests/cluster: etcd, kube-apiserver,
#     controller-manager, scheduler, containerd, kubelet, and the registry the
#     node pulls from), in this run's work directory;
#  5. start our CSI node plugin as a host process beside the kubelet; the kubelet
#     finds its registration socket and lists csi.rukpak.io on the Node's CSINode;
#  6. apply storageclass/csidriver.yaml, push the bundle to the node's registry,
#     run a pod whose inline CSI volume is the bundle, print what it sees;
#  7. rukpak apply IMAGE --name hello, rukpak status hello, rukpak uninstall hello.
# With KUBECONFIG set, part 2 only runs `rukpak apply/status/uninstall` into a
# namespace named for this run (nothing is started on a user's node).
#
# Unattended: no prompts, exits 0 on success and non-zero on the first failure.
# Everything started is stopped by pid (plugin, cluster, registry), even on failure.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PY="$VENV/bin/python"
RUKPAK="$VENV/bin/rukpak"
BUNDLE=examples/bundles/hello
REGISTRY_BINARY=/usr/bin/docker-registry
DRIVER=csi.rukpak.io
USER_KUBECONFIG=${KUBECONFIG:-}

say() { printf '\n\033[1m== %s\033[0m  (%ss)\n' "$*" "$(since "$T0")"; }
run() { printf '$ %s\n' "$*"; "$@"; }
now() { echo "${EPOCHREALTIME/./}"; }   # microseconds
since() { local d=$(( $(now) - $1 )); printf '%d.%d' $((d / 1000000)) $((d % 1000000 / 100000)); }
T0=$(now)

for tool in "$PY" "$RUKPAK" "$REGISTRY_BINARY"; do
  if [ ! -x "$tool" ]; then
    echo "run.sh: $tool is missing; run 'make setup' first" >&2
    exit 1
  fi
done

WORK=$(mktemp -d -t rukpak-run.XXXXXX)
SERVER_PID=""        # the Python process that keeps the demo registry
PLUGIN_PID=""        # our CSI node plugin (host process)
CLUSTER_DIR=""       # set once `python -m tests.cluster up` was started
RUN_NS=""            # a user's cluster: the namespace of this run
KUBECTL=""

stop_pid() {  # SIGTERM, then SIGKILL after $2 seconds
  local pid=$1 grace=${2:-10}
  kill -0 "$pid" 2>/dev/null || return 0
  kill "$pid" 2>/dev/null || true
  for _ in $(seq $((grace * 10))); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

cleanup() {
  local status=$?
  trap - EXIT INT TERM
  if [ "$status" -ne 0 ] && [ -s "$WORK/plugin/plugin.log" ]; then
    echo "run.sh: the plugin's last log lines:" >&2
    tail -n 15 "$WORK/plugin/plugin.log" >&2 || true
  fi
  if [ -n "$RUN_NS" ] && [ -n "$KUBECTL" ]; then
    "$RUKPAK" uninstall hello-run --system-namespace "$RUN_NS" >/dev/null 2>&1 || true
    "$KUBECTL" delete namespace "$RUN_NS" --wait=false >/dev/null 2>&1 || true
  fi
  if [ -n "$PLUGIN_PID" ]; then
    stop_pid "$PLUGIN_PID" 15
  fi
  if [ -n "$CLUSTER_DIR" ]; then
    "$PY" -m tests.cluster down --dir "$CLUSTER_DIR" || status=1
  fi
  if [ -n "$SERVER_PID" ]; then
    stop_pid "$SERVER_PID" 10  # it stops the registry, then exits
  fi
  if grep -q " $WORK" /proc/self/mountinfo; then
    echo "run.sh: something is still mounted under $WORK; left in place" >&2
    status=1
  elif [ "$status" -ne 0 ]; then
    echo "run.sh: failed (exit $status); everything started was stopped; logs kept in $WORK" >&2
  else
    rm -rf "$WORK"
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------------------------------
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
T_BUNDLES=$(since "$T0")

# ---------------------------------------------------------------------------------------
# Part 2a: a user's cluster. Only the apply engine, only in a namespace of this run.
user_cluster() {
  KUBECTL=$("$PY" -c 'from tests.cluster import bins; print(bins.find("kubectl") or "")')
  KUBECTL=${KUBECTL:-$(command -v kubectl || true)}
  say "KUBECONFIG is set: using that cluster carefully"
  echo "KUBECONFIG=$USER_KUBECONFIG is someone's cluster, so this run starts nothing on its"
  echo "nodes: no CSI plugin, no CSIDriver object, no pods. It only installs a copy of the"
  echo "hello bundle into a namespace named for this run, shows its status and removes it."
  if [ -z "$KUBECTL" ] || ! "$KUBECTL" version --request-timeout=5s >/dev/null 2>&1; then
    echo "The cluster does not answer (or kubectl is missing): skipping the cluster part."
    return 0
  fi
  RUN_NS="rukpak-run-$(basename "$WORK" | cut -d. -f2 | tr 'A-Z' 'a-z')"
  local dir="$WORK/hello-run"
  mkdir -p "$dir/manifests"
  # the namespaced objects of hello, without their fixed namespace (-n places them)
  for f in 02_configmap.yaml 03_deployment.yaml; do
    grep -v '^  namespace: hello$' "$BUNDLE/manifests/$f" >"$dir/manifests/$f"
  done
  local image="$REGISTRY/examples/hello-run:v1"
  run "$KUBECTL" create namespace "$RUN_NS"
  run "$RUKPAK" bundle build "$dir" --tag "$image" --push
  say "rukpak apply $image into namespace $RUN_NS"
  run "$RUKPAK" apply "$image" --name hello-run -n "$RUN_NS" --system-namespace "$RUN_NS"
  say "rukpak status hello-run"
  run "$RUKPAK" status hello-run --system-namespace "$RUN_NS" \
    || echo "(not all ready yet: this run does not wait for the Deployment's pod)"
  say "rukpak uninstall hello-run, then delete namespace $RUN_NS"
  run "$RUKPAK" uninstall hello-run --system-namespace "$RUN_NS"
  run "$KUBECTL" delete namespace "$RUN_NS" --wait=false
  RUN_NS=""
}

# Part 2b: our own single-node cluster, with the CSI plugin beside its kubelet.
local_cluster() {
  CLUSTER_DIR="$WORK/cluster"
  say "Starting a single-node Kubernetes on loopback"
  echo "etcd, kube-apiserver, kube-controller-manager, kube-scheduler, a registry for the"
  echo "node, containerd and a kubelet, all built from upstream v1.34 sources (cached):"
  run "$PY" -m tests.cluster up --dir "$CLUSTER_DIR"
  export KUBECONFIG="$CLUSTER_DIR/admin.kubeconfig"
  local info
  info=$("$PY" - "$CLUSTER_DIR" <<'PY'
import sys
from pathlib import Path

from tests.cluster import bins
from tests.cluster.localcluster import LocalCluster

c = LocalCluster.load(Path(sys.argv[1]))
print(c.registry_host, c.busybox_image, c.node_name, c.kubelet_dir, bins.find("kubectl"))
PY
)
  local node_registry busybox node kubelet_dir
  read -r node_registry busybox node kubelet_dir KUBECTL <<<"$info"
  T_CLUSTER=$(since "$T0")

  say "Starting our CSI node plugin as a host process"
  echo "It runs beside the kubelet (as the DaemonSet's container would): its CSI socket in"
  echo "the kubelet's plugins dir, a registration socket in plugins_registry that the"
  echo "kubelet's plugin watcher finds, and mounts only under $kubelet_dir."
  mkdir -p "$WORK/plugin"
  local sock="$kubelet_dir/plugins/$DRIVER/csi.sock"
  printf '$ %s\n' "$PY -m csi.plugin --endpoint unix://$sock --node-id $node --kubelet-dir $kubelet_dir --registration-dir $kubelet_dir/plugins_registry --state-dir $WORK/plugin/state &"
  "$PY" -m csi.plugin --endpoint "unix://$sock" --node-id "$node" \
    --kubelet-dir "$kubelet_dir" --registration-dir "$kubelet_dir/plugins_registry" \
    --state-dir "$WORK/plugin/state" >"$WORK/plugin/plugin.log" 2>&1 &
  PLUGIN_PID=$!
  echo "plugin pid $PLUGIN_PID, log $WORK/plugin/plugin.log"
  local drivers=""
  for _ in $(seq 150); do
    kill -0 "$PLUGIN_PID" 2>/dev/null || { echo "run.sh: the plugin exited" >&2; exit 1; }
    drivers=$("$KUBECTL" get csinode "$node" -o jsonpath='{.spec.drivers[*].name}' 2>/dev/null || true)
    [[ " $drivers " == *" $DRIVER "* ]] && break
    sleep 0.2
  done
  [[ " $drivers " == *" $DRIVER "* ]] || { echo "run.sh: kubelet did not register $DRIVER" >&2; exit 1; }
  echo "The kubelet registered it; the Node's CSINode lists:"
  run "$KUBECTL" get csinode "$node" -o jsonpath='{range .spec.drivers[*]}  driver={.name} nodeID={.nodeID}{"\n"}{end}'
  grep -m1 "registered with kubelet" "$WORK/plugin/plugin.log" || true

  say "Applying the CSIDriver object"
  echo "It tells the kubelet: nothing to attach, pass pod info on mount, inline volumes OK."
  run "$KUBECTL" apply -f storageclass/csidriver.yaml

  say "Pushing the bundle to the registry the node pulls from"
  echo "This machine has no internet, so the copy for the cluster points its Deployment's"
  echo "image at the node's local busybox ($busybox)."
  local dir="$WORK/hello-local"
  cp -r "$BUNDLE" "$dir"
  sed -i "s|docker.io/library/busybox:1.36|$busybox|" "$dir/manifests/03_deployment.yaml"
  local image="$node_registry/examples/hello:v1"
  run "$RUKPAK" bundle build "$dir" --tag "$image" --platform linux/amd64,linux/arm64 --push

  say "Running a pod that mounts the bundle as an inline CSI volume"
  cat >"$WORK/bundle-reader.yaml" <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: bundle-reader
  labels: {app.kubernetes.io/part-of: rukpak}
spec:
  restartPolicy: Never
  containers:
    - name: reader
      image: $busybox
      command: ["sh", "-c", "ls -l /bundle/manifests && cat /bundle/manifests/02_configmap.yaml && (touch /bundle/x || echo 'writing to /bundle fails: it is read-only')"]
      volumeMounts: [{name: bundle, mountPath: /bundle}]
  volumes:
    - name: bundle
      csi:
        driver: $DRIVER
        readOnly: true
        volumeAttributes: {image: "$image"}
EOF
  sed -n '/volumes:/,$p' "$WORK/bundle-reader.yaml"
  # the default ServiceAccount appears a moment after the cluster starts
  for i in $(seq 60); do
    "$KUBECTL" apply -f "$WORK/bundle-reader.yaml" 2>"$WORK/apply.err" && break
    [ "$i" -eq 60 ] && { cat "$WORK/apply.err" >&2; exit 1; }
    sleep 0.5
  done
  run "$KUBECTL" wait pod/bundle-reader --for=jsonpath='{.status.phase}'=Succeeded --timeout=90s
  echo "What the pod printed:"
  run "$KUBECTL" logs bundle-reader
  echo "kubectl describe pod, the volume and the events:"
  "$KUBECTL" describe pod bundle-reader | sed -n '/^Volumes:/,/^QoS Class:/p;/^Events:/,$p' \
    | grep -v '^QoS Class:' | tee "$WORK/describe.txt"
  if grep -q 'FailedMount.*kube-api-access' "$WORK/describe.txt"; then
    echo "(a FailedMount of kube-api-access-* just after start-up is the kubelet's ConfigMap"
    echo " cache warming up; it retries at once. Our volume is the one named 'bundle'.)"
  fi
  local uid target
  uid=$("$KUBECTL" get pod bundle-reader -o jsonpath='{.metadata.uid}')
  target="$kubelet_dir/pods/$uid/volumes/kubernetes.io~csi/bundle/mount"
  run "$KUBECTL" delete pod bundle-reader --wait=true
  echo "The plugin's side (pull and unpack once, read-only bind mount, unmount):"
  grep -E "msg='(image unpacked|published|unpublished)'" "$WORK/plugin/plugin.log" \
    | sed -E 's/ (volume_id|digest|fetched_bytes)=[^ ]*//g' || true
  for _ in $(seq 100); do
    grep -qF " $target " /proc/self/mountinfo || [ -e "$target" ] || break
    sleep 0.1
  done
  if grep -qF " $target " /proc/self/mountinfo || [ -e "$target" ]; then
    echo "run.sh: $target is still there after the pod was deleted" >&2
    exit 1
  fi
  echo "The pod is gone and so is its volume: $target is unmounted and removed."
  T_CSI=$(since "$T0")

  say "rukpak apply $image --name hello"
  echo "The apply engine pulls the same image, orders the objects (Namespace first) and"
  echo "applies them with server-side apply, then waits until they are ready:"
  run "$RUKPAK" apply "$image" --name hello --wait 90
  say "rukpak status hello"
  run "$RUKPAK" status hello
  run "$KUBECTL" logs -n hello deployment/hello
  say "rukpak uninstall hello"
  run "$RUKPAK" uninstall hello
}

T_CLUSTER="" T_CSI=""
if [ -n "$USER_KUBECONFIG" ]; then
  user_cluster
else
  local_cluster
fi

say "Done in $(since "$T0")s"
cat <<EOF
What happened:
  - examples/bundles/hello/manifests/ was checked and packed into one deterministic
    tar+gzip layer; one OCI image manifest per platform (linux/amd64, linux/arm64)
    points at it, and an OCI index lists both; 'rukpak bundle inspect' read it back
    the way the CSI driver pulls bundles (resolve, pick the platform, verify).
EOF
if [ -z "$USER_KUBECONFIG" ]; then
  cat <<EOF
  - a single-node Kubernetes started on loopback; our CSI node plugin registered with
    its kubelet (no node-driver-registrar: the plugin serves kubelet's registration API);
  - a pod got the bundle as a read-only CSI volume at /bundle: the plugin pulled the
    image (by digest, verified), unpacked it once into its node cache and bind-mounted
    it read-only; deleting the pod unmounted and removed it;
  - 'rukpak apply' installed the same image's manifests, 'rukpak status' saw them
    ready, 'rukpak uninstall' removed them.
Timings: bundles ${T_BUNDLES}s, cluster up at ${T_CLUSTER}s, CSI pod done at ${T_CSI}s, total $(since "$T0")s.
Everything started (plugin, cluster, registries) is being stopped now by pid.
EOF
else
  echo "Timings: bundles ${T_BUNDLES}s, total $(since "$T0")s. The registry is being stopped now."
fi
