// Command etcd is upstream's etcd server (go.etcd.io/etcd/server/v3, the version
// k8s.io/kubernetes v1.34.4 requires), built beside the Kubernetes binaries so the two
// share one module graph and one build cache (see ../../../build.sh).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
