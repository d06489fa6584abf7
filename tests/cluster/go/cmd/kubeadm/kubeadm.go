// Command kubeadm is upstream's cmd/kubeadm/kubeadm.go from k8s.io/kubernetes v1.34.4, for
// the kind node image (tests/kind: kind runs `kubeadm init` inside its node containers;
// ../../../build.sh builds it).
package main

import (
	"k8s.io/kubernetes/cmd/kubeadm/app"
	utilerrors "k8s.io/kubernetes/cmd/kubeadm/app/util/errors"
)

func main() {
	utilerrors.HandleError(app.Run())
}
