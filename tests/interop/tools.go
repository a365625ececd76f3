//go:build tools

// Package tools pins the upstream binaries that build.sh compiles.
package tools

import (
	_ "sigs.k8s.io/apiserver-network-proxy/cmd/agent"
	_ "sigs.k8s.io/apiserver-network-proxy/cmd/server"
	_ "sigs.k8s.io/apiserver-network-proxy/cmd/test-client"
	_ "sigs.k8s.io/apiserver-network-proxy/cmd/test-server"
)
