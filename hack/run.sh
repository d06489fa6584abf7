#!/usr/bin/env bash
# `make run`: the project's main job, end to end, on this machine only.
#
# Part 1, bundles (no cluster needed):
#  1. start a throwaway OCI registry (Debian's docker-registry) on a free port;
#  2. build the example bundle examples/bundles/hello for linux/amd64 and
#     linux/arm64 into an OCI layout, and push it;
#  3. inspect what the registry now holds, the way the CSI driver will see it.
# Part 2, RukPak installed and used (without KUBECONFIG):
#  4. start a Kubernetes of $NODES nodes (default 1; tests/cluster: etcd, kube-apiserver,
#     controller-manager, scheduler and the registry the nodes pull from in a network
#     namespace of their own; each node with containerd, kubelet and kube-proxy in its
#     own; CoreDNS), in this run's work directory;
#  5. build the project's image (hack/image/build.sh, no container engine) and push
#     it to the cluster's registry;
#  6. install RukPak from the shipped manifests as users do, everything reached through
#     Services: an overlay of deploy/ with the kubelet-root component (the kubelet dir
#     is a temp dir), the image, and the cluster's plain-HTTP registries; `kubectl apply -k`;
#  7. a pod reads the bundle through an inline CSI volume (the DaemonSet's plugin);
#  8. a BundleDeployment of hello: Installed and Healthy; a deleted managed Deployment
#     comes back; a template change pivots to a new Bundle; a bad image keeps the old
#     content with HasValidBundle=False; deleting the BundleDeployment removes it all;
#  9. a v1alpha2 BundleDeployment (content named inline, no Bundle) created paused shows
#     its permission preview, installs once approved, and reads as v1alpha1 through the
#     manager's conversion webhook; a failing upgrade misses its progress deadline and is
#     rolled back with its registry stopped (no pod: the manager kept revision 1's objects);
#     the pods of rukpak-system are printed before and after: the standing provisioner
#     ran every install, upgrade, Bundle check and preview, and no pod was started for one.
# Each step prints its wall time; every wait is bounded and shows `kubectl describe`
# when it fails.
# With KUBECONFIG set, part 2 only runs `rukpak apply/status/uninstall` into a
# namespace named for this run (nothing is started on a user's node).
#
# Unattended: no prompts, exits 0 on success and non-zero on the first failure.
# Everything started is stopped by pid (cluster, registry), even on failure.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
PY="$VENV/bin/python"
RUKPAK="$VENV/bin/rukpak"
BUNDLE=examples/bundles/hello
REGISTRY_BINARY=/usr/bin/docker-registry
DRIVER=csi.rukpak.io
USER_KUBECONFIG=${KUBECONFIG:-}

STEP="" STEP_T=0 TIMES=()
step_end() {  # the previous step's wall time
  if [ -n "$STEP" ]; then
    local took; took=$(since "$STEP_T")
    printf '   \033[2m(step took %ss)\033[0m\n' "$took"
    TIMES+=("$(printf '%7ss  %s' "$took" "$STEP")")
  fi
  STEP=""
}
say() {
  step_end
  printf '\n\033[1m== %s\033[0m  (at %ss)\n' "$*" "$(since "$T0")"
  STEP=$* STEP_T=$(now)
}
run() { printf '$ %s\n' "$*"; "$@"; }
wait_addr() {  # until the background process $2 has written its address line to $1
  for _ in $(seq 300); do
    [ -s "$1" ] && break
    kill -0 "$2" 2>/dev/null || { echo "run.sh: the registry did not start" >&2; exit 1; }
    sleep 0.1
  done
}
now() { echo "${EPOCHREALTIME/./}"; }   # microseconds
since() { local d=$(( $(now) - $1 )); printf '%d.%d' $((d / 1000000)) $((d % 1000000 / 100000)); }
T0=$(now)

WORK=$(mktemp -d -t rukpak-run.XXXXXX)
SERVER_PID=""        # the Python process that keeps the demo registry
RUN_REGISTRY_PID=""  # the Python process that keeps the registry of the v1alpha2 bundle
NODES=${NODES:-1}
OVERLAY=""           # the install overlay (local cluster)
CLUSTER=${CLUSTER:-local}  # local (tests/cluster) or kind (tests/kind: make kind-run)
CLUSTER_DIR=""       # set once `python -m tests.cluster up` was started
KIND_RUN_REGISTRY="" # kind: the container of the v1alpha2 bundle's registry
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

stop_run_registry() {  # the registry of the v1alpha2 bundle, whichever kind it is
  if [ -n "$RUN_REGISTRY_PID" ]; then
    stop_pid "$RUN_REGISTRY_PID" 10
    RUN_REGISTRY_PID=""
  fi
  if [ -n "$KIND_RUN_REGISTRY" ]; then
    "$PY" -m tests.kind registry stop "$KIND_RUN_REGISTRY" || true
    KIND_RUN_REGISTRY=""
  fi
}

cleanup() {
  local status=$?
  trap - EXIT INT TERM
  if [ "$status" -ne 0 ] && [ -n "$OVERLAY" ] && [ -n "$KUBECTL" ]; then
    echo "run.sh: rukpak-system at the failure (pods, then each pod's last log lines):" >&2
    "$KUBECTL" get pods -n rukpak-system -o wide >&2 2>&1 || true
    for pod in $("$KUBECTL" get pods -n rukpak-system -o name 2>/dev/null); do
      echo "--- $pod" >&2
      "$KUBECTL" logs -n rukpak-system "$pod" --all-containers --tail=15 >&2 2>&1 || true
    done
  fi
  if [ -n "$RUN_NS" ] && [ -n "$KUBECTL" ]; then
    "$RUKPAK" uninstall hello-run --system-namespace "$RUN_NS" >/dev/null 2>&1 || true
    "$KUBECTL" delete namespace "$RUN_NS" --wait=false >/dev/null 2>&1 || true
  fi
  stop_run_registry
  local prep
  # each build runs in a session of its own (setsid): its whole group goes, compilers too
  for prep in $PREP_BINS_PID $PREP_IMAGE_PID; do
    kill -0 "$prep" 2>/dev/null && { kill -- "-$prep" 2>/dev/null || true; }
    stop_pid "$prep" 30
  done
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
# On a new machine the slow part is building: Kubernetes from its Go modules (about 5
# minutes of both cores) and the image's Debian base layer. With a local cluster to come,
# Kubernetes starts building first, beside the machine's set-up (`make setup`: Debian
# packages and the venv, mostly downloads), and the image once the venv is there, beside
# part 1 (each logs to $WORK; each is a no-op when its cache is warm); part 2 waits for
# them where it needs them. The binaries are bins.NETWORKED (tests/cluster/bins.py).
PREP_BINS_PID="" PREP_IMAGE_PID=""
LOCAL_PREP=""
if [ "$CLUSTER" = local ] && [ -z "$USER_KUBECONFIG" ]; then
  LOCAL_PREP=1
  if command -v go >/dev/null; then
    setsid bash tests/cluster/build.sh --quiet etcd kube-apiserver kube-controller-manager \
      kube-scheduler kubelet kubectl kube-proxy coredns >"$WORK/k8s-bins.log" 2>&1 &
    PREP_BINS_PID=$!
  fi
fi
bash hack/setup.sh
for tool in "$PY" "$RUKPAK" "$REGISTRY_BINARY"; do
  if [ ! -x "$tool" ]; then
    echo "run.sh: $tool is missing after hack/setup.sh" >&2
    exit 1
  fi
done
if [ -n "$LOCAL_PREP" ]; then
  setsid bash hack/image/build.sh --oci-layout "$WORK/image-prep" >"$WORK/image-prep.log" 2>&1 &
  PREP_IMAGE_PID=$!
fi
wait_prep() {  # wait_prep PID WHAT LOG: wait for a build started above; its log if it failed
  local pid=$1 what=$2 log=$3 t; t=$(now)
  [ -n "$pid" ] || return 0
  if ! wait "$pid"; then
    echo "run.sh: building $what failed; its log ($log) ends:" >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
  echo "($what: built beside the steps above; waited $(since "$t")s more for it here)"
}

say "Starting a local OCI registry"
# The same helper the tests use (a free loopback port, storage under $WORK),
# kept alive by a small Python process: the registry dies with its parent, and
# SIGTERM to the parent stops it cleanly.
"$PY" - "$WORK/registry" >"$WORK/registry.addr" <<'PY' &
import sys
from pathlib import Path

from tests.registry import RegistryServer, hold

server = RegistryServer.start(Path(sys.argv[1]))
hold(server.stop, server.host, server.pid)
PY
SERVER_PID=$!
wait_addr "$WORK/registry.addr" "$SERVER_PID"
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

# Part 2b: our own single-node cluster, RukPak installed from deploy/ and used.

# poll SECONDS WHAT DESCRIBE -- CMD...: run CMD every 0.5 s until it succeeds; on timeout
# say what never happened, show `kubectl describe` of each DESCRIBE item (KIND, KIND/NAME
# or NAMESPACE:KIND/NAME, space-separated) and fail.
poll() {
  local timeout=$1 what=$2 describe=$3
  shift 4
  local deadline=$(( $(now) + timeout * 1000000 ))
  until "$@" >/dev/null 2>&1; do
    if [ "$(now)" -ge "$deadline" ]; then
      echo "run.sh: timed out after ${timeout}s waiting for $what" >&2
      local item ns
      for item in $describe; do
        ns=default
        [[ $item == *:* ]] && { ns=${item%%:*}; item=${item#*:}; }
        echo "run.sh: kubectl describe -n $ns $item:" >&2
        "$KUBECTL" describe -n "$ns" "$item" >&2 2>&1 || true
      done
      exit 1
    fi
    sleep 0.5
  done
  echo "ok: $what ($(since "$STEP_T")s into this step)"
}
no_instance_pods() {  # no_instance_pods BD: no instance pod of BD exists
  [ -z "$("$KUBECTL" get pods -n rukpak-system -o name \
    -l "core.rukpak.io/bundle-deployment=$1" 2>/dev/null)" ]
}

cond() {  # cond BD TYPE: the status of the BundleDeployment's condition TYPE
  "$KUBECTL" get bundledeployment "$1" \
    -o jsonpath="{.status.conditions[?(@.type==\"$2\")].status}" 2>/dev/null
}
bd_is() {  # bd_is BD TYPE STATUS
  [ "$(cond "$1" "$2")" = "$3" ]
}
has_preview() {  # has_preview BD: its preview run reported (status.preview.objects)
  [ -n "$("$KUBECTL" get bundledeployment "$1" -o jsonpath='{.status.preview.objects}')" ]
}
revision_is() {  # revision_is BD N: status.installedRevision is N
  [ "$("$KUBECTL" get bundledeployment "$1" -o jsonpath='{.status.installedRevision}')" = "$2" ]
}
active_bundle() { "$KUBECTL" get bundledeployment "$1" -o jsonpath='{.status.activeBundle}'; }
differs() { [ "$("${@:2}" 2>/dev/null)" != "$1" ] && [ -n "$("${@:2}" 2>/dev/null)" ]; }
is_absent() { ! "$KUBECTL" get "$@" >/dev/null 2>&1; }
none_left() {  # none_left ARGS...: kubectl get ARGS answers, and finds nothing
  local out
  out=$("$KUBECTL" get "$@" --ignore-not-found -o name 2>/dev/null) || return 1
  [ -z "$out" ]
}
greeting() { "$KUBECTL" get configmap hello-greeting -n hello -o jsonpath='{.data.greeting}'; }
has_greeting() { [ "$(greeting 2>/dev/null)" = "$1" ]; }
deployment_uid() { "$KUBECTL" get deployment hello -n hello -o jsonpath='{.metadata.uid}'; }
available() {
  [ "$("$KUBECTL" get deployment "$@" -o jsonpath='{.status.availableReplicas}')" = 1 ]
}
system_pods() {  # the pods of rukpak-system, a name a line
  "$KUBECTL" get pods -n rukpak-system -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}'
}
new_pods() {  # new_pods BEFORE: pods the scheduler placed in rukpak-system that BEFORE lacks
  "$KUBECTL" get events -n rukpak-system --field-selector reason=Scheduled \
    -o jsonpath='{range .items[*]}{.involvedObject.name}{"\n"}{end}' | sort -u | grep -vxF -f <(printf '%s\n' "$1") || true
}
pod_phase_is() { [ "$("$KUBECTL" get pod "$1" -o jsonpath='{.status.phase}')" = "$2" ]; }
show() { printf '$ kubectl %s\n' "$*"; "$KUBECTL" "$@"; }

local_cluster() {
  CLUSTER_DIR="$WORK/cluster"
  say "Starting a Kubernetes of $NODES node(s)"
  wait_prep "$PREP_BINS_PID" "Kubernetes (etcd, control plane, kubelet, kube-proxy, CoreDNS)" \
    "$WORK/k8s-bins.log"
  PREP_BINS_PID=""
  echo "etcd, kube-apiserver, kube-controller-manager, kube-scheduler and a registry in a"
  echo "network namespace of their own; each node in its own network and mount namespaces"
  echo "with containerd, a kubelet and kube-proxy; CoreDNS. All built from upstream sources"
  echo "(Kubernetes v1.34, CoreDNS; cached); no address leads out of this machine:"
  run "$PY" -m tests.cluster up --nodes "$NODES" --networked --dir "$CLUSTER_DIR"
  export KUBECONFIG="$CLUSTER_DIR/admin.kubeconfig"
  local info
  info=$("$PY" - "$CLUSTER_DIR" <<'PY'
import sys
from pathlib import Path

from tests.cluster import bins, machines
from tests.cluster.localcluster import LocalCluster

c = LocalCluster.load(Path(sys.argv[1]))
state = machines.common_dir(c.workdir) / "rukpak-csi"
print(c.registry_host, c.busybox_image, c.kubelet_dir, state, bins.find("kubectl"))
PY
)
  read -r node_registry busybox kubelet_dir state_dir KUBECTL <<<"$info"
  show get nodes -o wide
  T_CLUSTER=$(since "$T0")

  say "Starting a second registry the nodes reach (for the v1alpha2 bundle, stopped later)"
  # in the control plane's namespace, like the cluster's own; kept by a Python process
  "$PY" - "$WORK/run-registry" "$CLUSTER_DIR" >"$WORK/run-registry.addr" <<'PY' &
import sys
from pathlib import Path

from tests.cluster import images
from tests.cluster.localcluster import LocalCluster
from tests.registry import hold

cluster = LocalCluster.load(Path(sys.argv[2]))
assert cluster.network is not None
registry = images.start_registry(Path(sys.argv[1]), place=cluster.network.control_plane)
hold(registry.stop, registry.host, registry.component.pid)
PY
  RUN_REGISTRY_PID=$!
  wait_addr "$WORK/run-registry.addr" "$RUN_REGISTRY_PID"
  read -r run_registry run_registry_pid <"$WORK/run-registry.addr"
  run_registry_pid="pid $run_registry_pid"
  echo "docker-registry ($run_registry_pid) serves http://$run_registry"

  install_and_use
}

# Part 2c: a kind cluster (make kind-run): created or reused, left up (make kind-down).
kind_cluster() {
  say "Starting (or reusing) a kind cluster"
  echo "The Docker engine (Debian's docker.io, started here when none answers), the kind CLI"
  echo "(sigs.k8s.io/kind) and a node image built on this machine (Debian, containerd, the"
  echo "same Kubernetes v1.34 binaries; nothing pulled); a registry container on kind's"
  echo "network:"
  local info
  info=$("$PY" -m tests.kind up --dir "$WORK/kind") || {
    echo "run.sh: the kind cluster is not up (the reason is above; see docs/development.md, "On kind")" >&2
    exit 1
  }
  local kubeconfig
  read -r kind_name kubeconfig node_registry busybox <<<"$info"
  export KUBECONFIG="$kubeconfig"
  KUBECTL=$("$PY" -c 'from tests.cluster import bins; print(bins.find("kubectl") or "")')
  kubelet_dir=/var/lib/kubelet state_dir=/var/lib/rukpak-csi  # kind's and the install's defaults
  show get nodes -o wide
  echo "cluster: $kind_name; registry: $node_registry"
  T_CLUSTER=$(since "$T0")
  say "Starting a second registry the node reaches (for the v1alpha2 bundle, stopped later)"
  KIND_RUN_REGISTRY=run
  run_registry=$("$PY" -m tests.kind registry start "$KIND_RUN_REGISTRY")
  run_registry_pid="container ${kind_name}-registry-run"
  echo "docker-registry ($run_registry_pid) serves http://$run_registry"
  install_and_use
}

install_and_use() {
  say "Building the project's image and pushing it to the node's registry"
  echo "hack/image/build.sh needs no container engine: a cached Debian base layer and the"
  echo "project's wheel as a second layer. One image runs every component: the node"
  echo "plugin, the manager, and the instance and unpack pods the manager starts."
  wait_prep "$PREP_IMAGE_PID" "the image's layers" "$WORK/image-prep.log"
  PREP_IMAGE_PID=""
  local image_ref="$node_registry/rukpak/rukpak-python:run"
  bash hack/image/build.sh --insecure "$node_registry" --digest-file "$WORK/image.digest" "$image_ref" 2>&1 \
    | grep -E '^==> .*(cached|wheel|push|done)' || true
  [ -s "$WORK/image.digest" ] || { echo "run.sh: the image build failed" >&2; exit 1; }
  local image="${image_ref%:*}@$(cat "$WORK/image.digest")"
  echo "image: $image"

  say "Installing RukPak from the shipped manifests (deploy/)"
  echo "The default install: the manager, its webhooks (the conversion too) and contentURL"
  echo "are reached through Services, no pod but the node plugin uses the host network. This"
  echo "cluster differs from a standard one in two ways: its kubelet root is a temp dir"
  echo "(deploy/components/kubelet-root), and its registries speak plain HTTP on private"
  echo "addresses (one --insecure-registry flag each for the plugin and the manager). The"
  echo "overlay holds only those values and the image:"
  OVERLAY="$WORK/overlay"
  mkdir -p "$OVERLAY"
  local rel
  rel=$(realpath --relative-to="$OVERLAY" deploy)
  cat >"$OVERLAY/kustomization.yaml" <<YAML
resources: [$rel]
components:
  - $rel/components/kubelet-root
configMapGenerator:
  - name: rukpak-node-paths
    literals: [kubeletRoot=$kubelet_dir, stateDir=$state_dir]
patches:
  - target: {kind: DaemonSet, name: rukpak-csi-node}
    patch: |-
      - {op: add, path: /spec/template/spec/containers/0/args/-, value: --insecure-registry=$node_registry}
      - {op: add, path: /spec/template/spec/containers/0/args/-, value: --insecure-registry=$run_registry}
  - target: {kind: Deployment, name: rukpak-manager}
    patch: |-
      - {op: add, path: /spec/template/spec/containers/0/args/-, value: --insecure-registry=$node_registry}
      - {op: add, path: /spec/template/spec/containers/0/args/-, value: --insecure-registry=$run_registry}
images:
  - name: rukpak-python
    newName: ${image%@*}
    digest: ${image#*@}
YAML
  sed 's/^/    /' "$OVERLAY/kustomization.yaml"
  show apply -k "$OVERLAY"
  show rollout status -n rukpak-system daemonset/rukpak-csi-node --timeout=180s
  for d in $("$KUBECTL" get deployments -n rukpak-system -o name); do
    show rollout status -n rukpak-system "$d" --timeout=180s
  done
  show get pods -n rukpak-system -o wide
  show get services -n rukpak-system
  poll 60 "a manager replica holding the rukpak-manager Lease" "rukpak-system:lease/rukpak-manager" -- \
    "$KUBECTL" get lease rukpak-manager -n rukpak-system -o jsonpath='{.spec.holderIdentity}'
  echo "Lease holder (the other replica waits): $("$KUBECTL" get lease rukpak-manager \
    -n rukpak-system -o jsonpath='{.spec.holderIdentity}')"
  show get csinode -o jsonpath='{range .items[*].spec.drivers[*]}driver={.name} node={.nodeID}{"\n"}{end}'

  say "Pushing the hello bundle to the node's registry"
  echo "This machine has no internet, so the copy for the cluster points its Deployment's"
  echo "image at the node's local busybox ($busybox)."
  local dir="$WORK/hello-local"
  cp -r "$BUNDLE" "$dir"
  sed -i "s|docker.io/library/busybox:1.36|$busybox|" "$dir/manifests/03_deployment.yaml"
  local v1="$node_registry/examples/hello:v1" v2="$node_registry/examples/hello:v2"
  run "$RUKPAK" bundle build "$dir" --tag "$v1" --push --insecure
  echo "v2 differs in its greeting:"
  sed -i 's|Hello from a RukPak bundle|Hello from v2 of the bundle|' "$dir/manifests/02_configmap.yaml"
  run "$RUKPAK" bundle build "$dir" --tag "$v2" --push --insecure

  say "A pod reads the bundle through an inline CSI volume"
  cat >"$WORK/bundle-reader.yaml" <<YAML
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
      command: ["sh", "-c", "ls /bundle/manifests && (touch /bundle/x || echo 'writing to /bundle fails: it is read-only')"]
      volumeMounts: [{name: bundle, mountPath: /bundle}]
  volumes:
    - name: bundle
      csi: {driver: $DRIVER, readOnly: true, volumeAttributes: {image: "$v1"}}
YAML
  sed -n '/volumes:/,$p' "$WORK/bundle-reader.yaml"
  poll 30 "the default ServiceAccount (a fresh cluster makes it first)" "" -- \
    "$KUBECTL" get serviceaccount default
  show apply -f "$WORK/bundle-reader.yaml"
  poll 90 "the reader pod to succeed" "pod/bundle-reader" -- pod_phase_is bundle-reader Succeeded
  show logs bundle-reader
  show delete pod bundle-reader --wait=true

  local pods_before
  pods_before=$(system_pods)
  echo "The pods of rukpak-system before any BundleDeployment (the standing provisioner,"
  echo "rukpak-provisioner, takes every install, upgrade, rollback and Bundle check below as"
  echo "work: none of them starts a pod):"
  show get pods -n rukpak-system

  say "Creating a BundleDeployment of hello"
  cat >"$WORK/bd.yaml" <<YAML
apiVersion: core.rukpak.io/v1alpha1
kind: BundleDeployment
metadata:
  name: hello
spec:
  provisionerClassName: core-rukpak-io-plain
  template:
    metadata:
      labels: {app: hello}
    spec:
      provisionerClassName: core-rukpak-io-plain
      source:
        type: image
        image: {ref: "$v1"}
YAML
  cat "$WORK/bd.yaml"
  show apply -f "$WORK/bd.yaml"
  poll 180 "hello to be Installed" "bundledeployment/hello bundles" -- bd_is hello Installed True
  poll 120 "hello to be Healthy" "bundledeployment/hello bundles hello:deployment/hello" -- \
    bd_is hello Healthy True
  show get bd,bundles
  show get all,configmaps -n hello -l app.kubernetes.io/part-of=rukpak-examples
  echo "The instance ran to completion and recorded the install on the inventory ConfigMap;"
  echo "at rest no instance run is left (the manager watches the installed objects instead):"
  poll 60 "the instance run to finish" "pods" -- no_instance_pods hello
  show get pods -n rukpak-system -l core.rukpak.io/bundle-deployment=hello
  show get configmap rukpak-inventory-hello -n rukpak-system \
    -o jsonpath='install-record={.data.install-record}{"\n"}'
  local first_bundle
  first_bundle=$(active_bundle hello)

  say "Deleting the managed Deployment hello/hello: it comes back"
  echo "The manager sees an installed object go and restores it from the last version it saw"
  echo "(as the instance's ServiceAccount, no run; a DriftRestored event says so)."
  local uid
  uid=$(deployment_uid)
  show delete deployment hello -n hello --wait=false
  poll 60 "hello/hello to be recreated" "bundledeployment/hello" -- differs "$uid" deployment_uid
  poll 90 "hello/hello to be available again" "hello:deployment/hello" -- \
    available hello -n hello
  show get deployment hello -n hello

  say "Changing the template (v1 -> v2): the pivot"
  echo "A new Bundle is generated; the instance moves to it once it is unpacked; the old"
  echo "Bundle is deleted once the new one is installed."
  show patch bundledeployments.v1alpha1.core.rukpak.io hello --type=merge \
    -p "{\"spec\":{\"template\":{\"spec\":{\"source\":{\"image\":{\"ref\":\"$v2\"}}}}}}"
  poll 180 "the active Bundle to change" "bundledeployment/hello bundles" -- \
    differs "$first_bundle" active_bundle hello
  poll 60 "the v2 greeting in hello/hello-greeting" "bundledeployment/hello" -- \
    has_greeting "Hello from v2 of the bundle"
  poll 60 "the old Bundle $first_bundle to be deleted" "bundles" -- is_absent bundle "$first_bundle"
  poll 60 "hello to be Installed on v2" "bundledeployment/hello" -- bd_is hello Installed True
  poll 90 "hello to be Healthy on v2" "bundledeployment/hello hello:deployment/hello" -- \
    bd_is hello Healthy True
  show get bd,bundles

  say "Setting a bad image: the old content stays"
  echo "v3 is a bundle image whose manifests/ holds a subdirectory, which plain+v0 does not"
  echo "allow ('rukpak bundle build' refuses to make one, so hack/image/ocitool.py packs it)."
  local second_bundle
  second_bundle=$(active_bundle hello)
  local bad="$node_registry/examples/hello:v3-bad" baddir="$WORK/hello-bad"
  mkdir -p "$baddir/manifests/extra"
  cp "$dir/manifests/"*.yaml "$baddir/manifests/"
  cp "$dir/manifests/02_configmap.yaml" "$baddir/manifests/extra/"
  "$PY" hack/image/ocitool.py layer "$baddir" "$WORK/hello-bad.tar.gz" >/dev/null
  "$PY" hack/image/ocitool.py push --insecure "$node_registry" --layer "$WORK/hello-bad.tar.gz" --entrypoint /bin/false \
    --path /bin "$bad" | tail -n 1
  show patch bundledeployments.v1alpha1.core.rukpak.io hello --type=merge \
    -p "{\"spec\":{\"template\":{\"spec\":{\"source\":{\"image\":{\"ref\":\"$bad\"}}}}}}"
  poll 120 "HasValidBundle=False" "bundledeployment/hello bundles" -- bd_is hello HasValidBundle False
  show get bd,bundles
  echo "The conditions:"
  show get bundledeployment hello \
    -o jsonpath='{range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}'
  [ "$(active_bundle hello)" = "$second_bundle" ] \
    || { echo "run.sh: the active Bundle changed to $(active_bundle hello)" >&2; exit 1; }
  has_greeting "Hello from v2 of the bundle" \
    || { echo "run.sh: the v2 content is gone: $(greeting)" >&2; exit 1; }
  available hello -n hello || { echo "run.sh: hello/hello is not available" >&2; exit 1; }
  echo "Still active: $second_bundle; hello/hello is available and hello-greeting says: $(greeting)"

  say "A v1alpha2 BundleDeployment beside it, paused: a preview to approve"
  echo "core.rukpak.io/v1alpha2 (upstream v0.24's shape) is the storage version; the manager"
  echo "converts between the versions (its webhook) and plans each object in the version it"
  echo "was created in. This one installs a copy of hello living in namespace hello-inline,"
  echo "pushed to this run's own registry (stopped later, to roll back with it gone). It is"
  echo "created paused: nothing is applied, a preview run reports what it would do."
  local inline_dir="$WORK/hello-inline" inline="$run_registry/examples/hello-inline:v1"
  cp -r "$dir" "$inline_dir"
  sed -i 's/^\(  \(name\|namespace\)\): hello$/\1: hello-inline/' "$inline_dir/manifests/"*.yaml
  run "$RUKPAK" bundle build "$inline_dir" --tag "$inline" --push --insecure
  cat >"$WORK/bd-v1alpha2.yaml" <<YAML
apiVersion: core.rukpak.io/v1alpha2
kind: BundleDeployment
metadata:
  name: hello-inline
spec:
  installNamespace: hello-inline
  provisionerClassName: core-rukpak-io-plain
  source:
    type: image
    image: {ref: "$inline"}
  paused: true
  progressDeadlineSeconds: 15
  rollbackOnFailure: true
YAML
  cat "$WORK/bd-v1alpha2.yaml"
  show apply -f "$WORK/bd-v1alpha2.yaml"
  poll 180 "hello-inline's preview" "bundledeployment/hello-inline" -- has_preview hello-inline
  run "$RUKPAK" preview hello-inline
  is_absent namespace hello-inline \
    || { echo "run.sh: a paused BundleDeployment applied something" >&2; exit 1; }
  echo "Approving it: spec.paused=false."
  show patch bundledeployment hello-inline --type=merge -p '{"spec":{"paused":false}}'
  poll 180 "hello-inline to be Installed" "bundledeployment/hello-inline" -- \
    bd_is hello-inline Installed True
  poll 90 "hello-inline to be Healthy" "bundledeployment/hello-inline" -- \
    bd_is hello-inline Healthy True
  show get bd,bundles
  echo "Pinned by digest in its own status (no Bundle object was made for it):"
  show get bundledeployment hello-inline -o jsonpath='{.status.resolvedSource.image.ref}{"\n"}'
  echo "What a v1alpha1 client reads, through the conversion (a template of the same source):"
  show get bundledeployments.v1alpha1.core.rukpak.io hello-inline \
    -o jsonpath='{.spec.template.spec.source.image.ref}{"\n"}'
  show get deployment hello-inline -n hello-inline

  say "A failing upgrade rolled back without a pod, the registry stopped"
  echo "v2 runs an image that cannot be pulled: installed, never Healthy. Once it is applied"
  echo "this run's registry is stopped; 15 s after the upgrade (progressDeadlineSeconds) the"
  echo "manager rolls back to revision 1 from what it kept of it (no pod; the node cache"
  echo "still holds its content too, for when a run is needed)."
  local broken="$run_registry/examples/hello-inline:v2-broken" broken_dir="$WORK/hello-inline-v2"
  cp -r "$inline_dir" "$broken_dir"
  sed -i 's|^\(\s*image:\).*$|\1 127.0.0.1:9/unreachable:v0|' "$broken_dir/manifests/03_deployment.yaml"
  run "$RUKPAK" bundle build "$broken_dir" --tag "$broken" --push --insecure
  show patch bundledeployment hello-inline --type=merge \
    -p "{\"spec\":{\"source\":{\"image\":{\"ref\":\"$broken\"}}}}"
  poll 120 "revision 2 to be applied" "bundledeployment/hello-inline" -- \
    revision_is hello-inline 2
  echo "Stopping its registry ($run_registry_pid): nothing can be fetched from it now."
  stop_run_registry
  poll 120 "the progress deadline" "bundledeployment/hello-inline" -- \
    bd_is hello-inline Progressing False
  poll 180 "revision 1 to be back" "bundledeployment/hello-inline" -- revision_is hello-inline 1
  poll 90 "hello-inline to be Healthy again" "bundledeployment/hello-inline" -- \
    bd_is hello-inline Healthy True
  show get bundledeployment hello-inline \
    -o jsonpath='{range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}'
  run "$RUKPAK" history hello-inline
  show delete bundledeployment hello-inline --timeout=120s
  poll 60 "hello-inline/hello-inline to be gone" "namespace/hello-inline" -- \
    none_left -n hello-inline deployment/hello-inline configmap/hello-greeting

  say "Deleting the BundleDeployment: what it installed goes too"
  show delete bundledeployment hello --timeout=120s
  poll 60 "hello/hello and hello/hello-greeting to be gone" "namespace/hello" -- \
    none_left -n hello deployment/hello configmap/hello-greeting
  echo "(the namespace goes once its pod has stopped: hello's shell exits on SIGTERM)"
  poll 90 "namespace hello to be gone" "namespace/hello" -- is_absent namespace hello
  show get bd,bundles
  echo "The pods of rukpak-system after it all (the same as before):"
  show get pods -n rukpak-system
  local started
  started=$(new_pods "$pods_before")
  if [ -n "$started" ]; then
    echo "run.sh: pods were started for runs or checks: $started" >&2
    exit 1
  fi
  echo "No pod was started for the installs, the upgrade, the Bundle checks, the preview or"
  echo "the rollback: the standing provisioner ran them (its log: kubectl logs -n"
  echo "rukpak-system deployment/rukpak-provisioner)."
  show logs -n rukpak-system deployment/rukpak-provisioner --tail=5
  T_CSI=$(since "$T0")
}

T_CLUSTER="" T_CSI=""
if [ "$CLUSTER" = kind ]; then
  kind_cluster
elif [ -n "$USER_KUBECONFIG" ]; then
  user_cluster
else
  local_cluster
fi

step_end
printf '\n\033[1m== Done\033[0m  (at %ss)\n' "$(since "$T0")"
echo "Wall time per step:"
printf '%s\n' "${TIMES[@]}"
if [ "$CLUSTER" = kind ]; then
  WHERE="the kind cluster $kind_name (a node image built here; left up: make kind-down removes it)"
else
  WHERE="a Kubernetes of $NODES node(s) started (own network namespaces, kube-proxy, CoreDNS)"
fi
if [ "$CLUSTER" = kind ] || [ -z "$USER_KUBECONFIG" ]; then
  cat <<TXT
What happened:
  - examples/bundles/hello was packed into a deterministic OCI image (two platforms)
    and read back the way the CSI driver pulls bundles;
  - $WHERE,
    and RukPak was installed on it from deploy/ as users do, reached through Services
    (CRDs, CSIDriver, node plugin DaemonSet, two manager replicas with leader election,
    least-privilege RBAC) with only the image, the kubelet's path and the plain-HTTP
    registries changed;
  - a BundleDeployment installed hello, undid a deletion, pivoted to v2, kept v2 when
    v3's content was invalid (HasValidBundle=False, upstream's message), and took
    everything away when deleted;
  - a v1alpha2 BundleDeployment (upstream v0.24's shape, the source inline) was
    previewed while paused, installed once approved, without any Bundle object, read as
    v1alpha1 through the manager's conversion webhook; its failing upgrade was rolled
    back without a pod after its progress deadline, its registry stopped.
Total $(since "$T0")s; cluster up at ${T_CLUSTER}s. Everything started is being stopped now.
TXT
else
  echo "Total $(since "$T0")s. The registry is being stopped now."
fi
