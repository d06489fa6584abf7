// Command coredns is CoreDNS v1.12.4 (github.com/coredns/coredns's coredns.go) with only
// the plugins the test clusters' Corefiles name: tests/cluster/dns.py's and the one kubeadm
// writes for kind (tests/kind). Upstream's main imports all of its 50-odd plugins (cloud
// DNS providers among them), 1,278 packages to compile; these are about 750 (see
// ../build.sh). A Corefile naming another plugin fails at start with CoreDNS's own error.
package main

import (
	"github.com/coredns/coredns/coremain"

	// the plugins, as core/plugin/zplugin.go registers them (their order in a server
	// block comes from core/dnsserver/zdirectives.go, not from these imports)
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

func main() {
	coremain.Run()
}
