#!/usr/bin/env bash
# Builds the `helm` binary the helm provisioner (contrib/helm-provisioner) runs, from its Go
# module, cached (hack/gotool.sh). Called by `make helm` (part of `make test`'s set-up) and by
# the helm provisioner's image build.
#
#   hack/helm.sh [--print-path] [--quiet]
exec bash "$(dirname "${BASH_SOURCE[0]}")/gotool.sh" helm "$@"
