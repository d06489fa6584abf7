// Command kube-scheduler is upstream's cmd/kube-scheduler/scheduler.go from k8s.io/kubernetes v1.34.4, copied verbatim
// below the package clause so this wrapper module can build it (see ../../../build.sh).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register" // for JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version" // for version metric registration
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	command := app.NewSchedulerCommand()
	code := cli.Run(command)
	os.Exit(code)
}
