// Command kubelet is upstream's cmd/kubelet/kubelet.go from k8s.io/kubernetes v1.34.4; the
// shared imports and the run-and-exit live in ../internal/component so this wrapper module
// builds each component the same way (see ../../../build.sh).
package main

import (
	"context"

	"github.com/rukpak-python/tests/cluster/k8sbins/cmd/internal/component"
	"k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	component.Run(app.NewKubeletCommand(context.Background()))
}
