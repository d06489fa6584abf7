// Command kube-controller-manager is upstream's cmd/kube-controller-manager/controller-manager.go from k8s.io/kubernetes v1.34.4, copied verbatim
// below the package clause so this wrapper module can build it (see ../../../build.sh).
package main

import (
	"os"
	_ "time/tzdata" // for CronJob Time Zone support

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // for JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // load all the prometheus client-go plugin
	_ "k8s.io/component-base/metrics/prometheus/version"  // for version metric registration
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	command := app.NewControllerManagerCommand()
	code := cli.Run(command)
	os.Exit(code)
}
