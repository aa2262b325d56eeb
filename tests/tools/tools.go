//go:build tools

// Package tools pins the commands that build.sh compiles, so `go mod tidy` keeps them.
package tools

// helm, which the tests use too, is the renderer's: deploy/render-tools builds it once.
