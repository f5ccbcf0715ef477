// Command kubectl: the upstream CLI, started through its cobra command from k8s.io/kubectl as
// k8s.io/kubernetes/cmd/kubectl starts it.
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	if err := cli.RunNoErrOutput(cmd.NewDefaultKubectlCommand()); err != nil {
		util.CheckErr(err) // prints the error as kubectl does and exits non-zero
	}
}
