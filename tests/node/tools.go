//go:build tools

// Package tools pins the commands that build.sh compiles, so `go mod tidy` keeps them.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kubelet"
)
