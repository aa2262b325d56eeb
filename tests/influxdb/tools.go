//go:build tools

// Package tools pins influxd, the InfluxDB server the analysis tests query by InfluxQL.
package tools

import _ "github.com/influxdata/influxdb/cmd/influxd"
