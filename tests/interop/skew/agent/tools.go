//go:build tools

// Package tools pins the older upstream agent release used for version-skew tests.
package tools

import _ "sigs.k8s.io/apiserver-network-proxy/cmd/agent"
