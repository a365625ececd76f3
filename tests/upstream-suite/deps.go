//go:build upstreamsuite_deps

// Package upstreamsuite holds no code of its own. Upstream's integration suite,
// sigs.k8s.io/apiserver-network-proxy/tests, is made of _test.go files only, so its
// test-only imports are invisible to `go mod tidy` in this module; the blank imports
// below keep their modules (and go.sum lines) here. The build tag keeps this file out
// of every ordinary build. build.sh compiles the suite from the module cache.
package upstreamsuite

import (
	_ "github.com/google/uuid"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_model/go"
	_ "github.com/prometheus/common/expfmt"
	_ "github.com/spf13/pflag"
	_ "go.uber.org/goleak"
	_ "google.golang.org/grpc"
	_ "k8s.io/apimachinery/pkg/util/wait"
	_ "k8s.io/klog/v2"
	_ "sigs.k8s.io/apiserver-network-proxy/cmd/server/app/options"
	_ "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/client"
	_ "sigs.k8s.io/apiserver-network-proxy/konnectivity-client/pkg/common/metrics/testing"
	_ "sigs.k8s.io/apiserver-network-proxy/pkg/testing/metrics"
	_ "sigs.k8s.io/apiserver-network-proxy/tests/framework"
)
