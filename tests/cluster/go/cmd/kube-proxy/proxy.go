// Command kube-proxy is upstream's cmd/kube-proxy/proxy.go from k8s.io/kubernetes v1.34.4,
// run by each node of the multi-node local cluster (../../../build.sh builds it).
package main

import (
	"github.com/rukpak-python/tests/cluster/k8sbins/cmd/internal/component"
	"k8s.io/kubernetes/cmd/kube-proxy/app"
)

func main() {
	component.Run(app.NewProxyCommand())
}
