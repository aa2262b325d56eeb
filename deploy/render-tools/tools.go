//go:build tools

// Package tools pins the commands that build.sh compiles, so `go mod tidy` keeps them.
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
	_ "sigs.k8s.io/kustomize/kustomize/v5"
)
