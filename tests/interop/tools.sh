#!/usr/bin/env bash
# Tools for the kube/metrics/agent-HA/fault interop scenarios (kube_test.go, metrics_test.go,
# agent_test.go, faults_test.go), outside the work tree. Prints KEY=VALUE lines on stdout
# (PROMTOOL, HAPROXY_BIN, TOXIPROXY_BIN); progress on stderr.
#
#   promtool: extracted from Debian's prometheus package without installing the server
#             (apt-get download prometheus && dpkg-deb -x), cached as
#             ${XDG_CACHE_HOME:-$HOME/.cache}/konnectivity-tools/promtool
#   haproxy:  Debian's haproxy (apt-get install haproxy) if missing; the tests run it as a
#             plain foreground process with a generated config on loopback, never as a service.
#   toxiproxy: Shopify's toxiproxy server, pinned (TOXIPROXY_VERSION), built from the Go module
#             proxy with `go install` (GOBIN = the cache; GOFLAGS=-mod=mod, CGO off), cached as
#             ${XDG_CACHE_HOME:-$HOME/.cache}/konnectivity-tools/toxiproxy-<version>/server
#             (faults_test.go drives it over its HTTP API on loopback).
#
# Exit 1 if a tool is missing and cannot be provided (run.sh fails under CI=true, else the
# scenarios that need it skip).
set -uo pipefail

CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/konnectivity-tools"
rc=0

promtool="$CACHE/promtool"
if [[ ! -x "$promtool" ]]; then
  echo "tools.sh: extracting promtool from Debian's prometheus package" >&2
  tmp="$(mktemp -d)"
  if (cd "$tmp" && apt-get download prometheus >&2 && dpkg-deb -x prometheus_*.deb x >&2) &&
     [[ -x "$tmp/x/usr/bin/promtool" ]]; then
    mkdir -p "$CACHE" && cp "$tmp/x/usr/bin/promtool" "$promtool.tmp" && mv "$promtool.tmp" "$promtool"
  else
    echo "tools.sh: could not get promtool (apt-get download prometheus failed?)" >&2
    rc=1
  fi
  rm -rf "$tmp"
fi
[[ -x "$promtool" ]] && echo "PROMTOOL=$promtool"

haproxy="$(command -v haproxy || true)"
[[ -z "$haproxy" && -x /usr/sbin/haproxy ]] && haproxy=/usr/sbin/haproxy
if [[ -z "$haproxy" ]]; then
  echo "tools.sh: installing Debian's haproxy" >&2
  if { [[ "$(id -u)" == 0 ]] && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends haproxy >&2; } ||
     { command -v sudo >/dev/null && sudo -n env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends haproxy >&2; }; then
    haproxy="$(command -v haproxy || echo /usr/sbin/haproxy)"
  fi
  if [[ ! -x "$haproxy" ]]; then
    echo "tools.sh: could not install haproxy" >&2
    haproxy=""; rc=1
  fi
fi
[[ -n "$haproxy" ]] && echo "HAPROXY_BIN=$haproxy"
TOXIPROXY_VERSION="v2.5.0"
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
toxidir="$CACHE/toxiproxy-$TOXIPROXY_VERSION"
toxiproxy="$toxidir/server"
if [[ ! -x "$toxiproxy" ]]; then
  echo "tools.sh: building toxiproxy $TOXIPROXY_VERSION (go install github.com/Shopify/toxiproxy/v2/cmd/server@$TOXIPROXY_VERSION)" >&2
  mkdir -p "$CACHE" && tmpbin="$(mktemp -d "$CACHE/.toxiproxy-build-XXXXXX")"
  if GOBIN="$tmpbin" CGO_ENABLED=0 GOFLAGS=-mod=mod \
       "$GO" install -trimpath "github.com/Shopify/toxiproxy/v2/cmd/server@$TOXIPROXY_VERSION" >&2 &&
     [[ -x "$tmpbin/server" ]]; then
    mkdir -p "$toxidir" && mv "$tmpbin/server" "$toxiproxy.tmp" && mv "$toxiproxy.tmp" "$toxiproxy"
  else
    echo "tools.sh: could not build toxiproxy $TOXIPROXY_VERSION" >&2
    rc=1
  fi
  rm -rf "$tmpbin"
fi
[[ -x "$toxiproxy" ]] && echo "TOXIPROXY_BIN=$toxiproxy"
exit $rc
