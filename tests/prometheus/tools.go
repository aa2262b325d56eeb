//go:build tools

// Package tools pins Prometheus, the metrics server the analysis and monitoring tests query,
// and promtool, which checks and unit-tests deploy/monitoring's alert rules.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)
