// Command kube-scheduler is upstream's cmd/kube-scheduler/scheduler.go from
// k8s.io/kubernetes v1.34.4; the shared imports and the run-and-exit live in
// ../internal/component so this wrapper module builds each component the same way (see
// ../../../build.sh).
package main

import (
	"github.com/rukpak-python/tests/cluster/k8sbins/cmd/internal/component"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	component.Run(app.NewSchedulerCommand())
}
