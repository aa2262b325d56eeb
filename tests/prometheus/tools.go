//go:build tools

// Package tools pins Prometheus, the metrics server the analysis tests query.
package tools

import _ "github.com/prometheus/prometheus/cmd/prometheus"
