//go:build tools

// Package tools pins what build.sh builds.
package tools

import (
	_ "github.com/traefik/traefik/v3/cmd/traefik"
	_ "sigs.k8s.io/gateway-api/apis/v1"
)
