#!/usr/bin/env bash
# Builds the upstream Konnectivity binaries used by the interop tests into a
# cache OUTSIDE the work tree and prints the cache directory on the last line
# of stdout. Skips the build when the cache entry is already complete.
#
#   ${XDG_CACHE_HOME:-$HOME/.cache}/konnectivity-interop/<key>/
#     proxy-server proxy-agent proxy-test-client http-test-server   (v0.36.0)
#     proxy-agent-v0.34.0                                            (skew: older agent)
#     skew-client-v0.31.2                                            (skew: older konnectivity-client)
#
# key = pinned versions + sha256 of all go.mod/go.sum (+ skew client source) + go version.
# The cache itself (lock, complete entries renamed into place): tests/lib/build-cache.sh.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib/build-cache.sh
source "$HERE/../lib/build-cache.sh"
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"

SERVER_MODULE_VERSION="v0.36.0"   # newest sigs.k8s.io/apiserver-network-proxy on the module proxy
CLIENT_VERSION="v0.37.0"          # konnectivity-client version we replace
SKEW_AGENT_VERSION="v0.34.0"
SKEW_CLIENT_VERSION="v0.31.2"

GOVERSION="$("$GO" env GOVERSION)"
SUM="$(cd "$HERE" && cat go.mod go.sum skew/agent/go.mod skew/agent/go.sum skew/client/go.mod skew/client/go.sum skew/client/main.go | sha256sum | cut -c1-16)"
KEY="server-${SERVER_MODULE_VERSION}_client-${CLIENT_VERSION}_skew-${SKEW_AGENT_VERSION}-${SKEW_CLIENT_VERSION}_${GOVERSION}_${SUM}"
BINARIES=(proxy-server proxy-agent proxy-test-client http-test-server "proxy-agent-${SKEW_AGENT_VERSION}" "skew-client-${SKEW_CLIENT_VERSION}")
cache_setup konnectivity-interop "$KEY" "${BINARIES[@]}"
cache_reuse_or_lock

build() { # <module dir> <output name> <package>
  local dir="$1" name="$2" pkg="$3" start end
  start=$(date +%s.%N)
  if ! (cd "$dir" && CGO_ENABLED=0 "$GO" build -trimpath -o "$TMP/$name" "$pkg"); then
    echo "build.sh: FAILED to build $name ($pkg in $dir)" >&2
    exit 1
  fi
  end=$(date +%s.%N)
  printf 'build.sh: built %-26s in %6.1fs\n' "$name" "$(echo "$end - $start" | bc)" >&2
}

T0=$(date +%s.%N)
build "$HERE" proxy-server       sigs.k8s.io/apiserver-network-proxy/cmd/server
build "$HERE" proxy-agent        sigs.k8s.io/apiserver-network-proxy/cmd/agent
build "$HERE" proxy-test-client  sigs.k8s.io/apiserver-network-proxy/cmd/test-client
build "$HERE" http-test-server   sigs.k8s.io/apiserver-network-proxy/cmd/test-server
build "$HERE/skew/agent"  "proxy-agent-${SKEW_AGENT_VERSION}"  sigs.k8s.io/apiserver-network-proxy/cmd/agent
build "$HERE/skew/client" "skew-client-${SKEW_CLIENT_VERSION}" .
printf 'build.sh: total build time %.1fs\n' "$(echo "$(date +%s.%N) - $T0" | bc)" >&2

cat > "$TMP/VERSIONS" <<VERS
sigs.k8s.io/apiserver-network-proxy ${SERVER_MODULE_VERSION} (proxy-server proxy-agent proxy-test-client http-test-server)
sigs.k8s.io/apiserver-network-proxy/konnectivity-client ${CLIENT_VERSION} (test driver)
sigs.k8s.io/apiserver-network-proxy ${SKEW_AGENT_VERSION} (proxy-agent-${SKEW_AGENT_VERSION})
sigs.k8s.io/apiserver-network-proxy/konnectivity-client ${SKEW_CLIENT_VERSION} (skew-client-${SKEW_CLIENT_VERSION})
${GOVERSION}
VERS
cache_commit
