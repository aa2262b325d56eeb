// Command kubectl is kubectl: the same two calls as k8s.io/kubernetes/cmd/kubectl, built
// from the published k8s.io/kubectl module, so that the install test runs the README's
// commands on a machine without kubectl.
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	command := cmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		util.CheckErr(err)
	}
}
