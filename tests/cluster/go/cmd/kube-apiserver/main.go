// Command kube-apiserver is upstream's cmd/kube-apiserver/apiserver.go from k8s.io/kubernetes
// v1.34.4; the shared imports and the run-and-exit live in ../internal/component so this
// wrapper module builds each component the same way (see ../../../build.sh).
package main

import (
	_ "time/tzdata" // for timeZone support in CronJob

	"github.com/rukpak-python/tests/cluster/k8sbins/cmd/internal/component"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	component.Run(app.NewAPIServerCommand())
}
