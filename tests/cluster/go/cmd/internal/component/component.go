// Package component runs an upstream Kubernetes component's cobra command the way
// upstream's cmd/<component>/<component>.go does in k8s.io/kubernetes v1.34.4 (the
// blank imports below are theirs, shared by kube-apiserver, kube-controller-manager,
// kube-scheduler and kubelet), so each of those main.go files is one call (see
// ../../../../build.sh).
package component

import (
	"os"

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // for JSON log format registration
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // load all the prometheus client-go plugins
	_ "k8s.io/component-base/metrics/prometheus/version"  // for version metric registration
)

// Run runs the command and exits the process with its code.
func Run(command *cobra.Command) {
	code := cli.Run(command)
	os.Exit(code)
}
