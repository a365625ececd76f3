#!/usr/bin/env bash
# Compiles upstream's integration suite (package sigs.k8s.io/apiserver-network-proxy/tests,
# from the Go module cache) into a test binary in a cache OUTSIDE the
# work tree, and prints the cache directory on the last line of stdout.
#
#   build.sh              upstream-tests.test           the package as published
#   build.sh --external   upstream-tests-external.test  the same package, copied for the
#                         build into a temporary module, plus our
#                         externalserver/zz_external_server_test.go (build tag
#                         upstreamsuite_external): an external proxy-server binary
#   both                  nxdns                         our NXDOMAIN stub (nxdns/), for
#                                                       run.sh's private network
#
#   ${XDG_CACHE_HOME:-$HOME/.cache}/konnectivity-upstream-suite/<key>/
#   key = variant + go version + sha256 of go.mod, go.sum, nxdns/main.go (+ externalserver/zz_external_server_test.go)
# The cache itself (lock, complete entries renamed into place): tests/lib/build-cache.sh.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib/build-cache.sh
source "$HERE/../lib/build-cache.sh"
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"

SUITE_PKG="sigs.k8s.io/apiserver-network-proxy/tests"
EXTERNAL_SRC="$HERE/externalserver/zz_external_server_test.go"
EXTERNAL_TAG="upstreamsuite_external"

VARIANT=inprocess
BINARY=upstream-tests.test
case "${1:-}" in
  "") ;;
  --external) VARIANT=external; BINARY=upstream-tests-external.test ;;
  *) echo "usage: $0 [--external]" >&2; exit 2 ;;
esac

GOVERSION="$("$GO" env GOVERSION)"
KEYED=("$HERE/go.mod" "$HERE/go.sum" "$HERE/nxdns/main.go")
[[ "$VARIANT" == external ]] && KEYED+=("$EXTERNAL_SRC")
SUM="$(cat "${KEYED[@]}" | sha256sum | cut -c1-16)"
cache_setup konnectivity-upstream-suite "${VARIANT}_${GOVERSION}_${SUM}" "$BINARY" nxdns
cache_reuse_or_lock

BUILD_DIR="$HERE" BUILD_PKG="$SUITE_PKG" BUILD_FLAGS=()
if [[ "$VARIANT" == external ]]; then
  # (go test -overlay refuses files beneath GOMODCACHE.) The suite's *.go files are copied
  # from the module cache (downloaded if missing) into a throwaway module in $TMP/src, made
  # of this module's go.mod and go.sum, next to our file; removed after the build. The
  # package still imports upstream's tests/framework from the module cache, unmodified.
  PKG_DIR="$(cd "$HERE" && GOWORK=off "$GO" list -f '{{.Dir}}' "$SUITE_PKG")"
  BUILD_DIR="$TMP/src"
  mkdir -p "$BUILD_DIR/suite"
  cp "$HERE/go.mod" "$HERE/go.sum" "$BUILD_DIR/"
  cp "$PKG_DIR"/*.go "$EXTERNAL_SRC" "$BUILD_DIR/suite/"
  chmod -R u+w "$BUILD_DIR"
  BUILD_PKG=./suite
  BUILD_FLAGS=(-tags "$EXTERNAL_TAG")
fi

start=$(date +%s)
if ! (cd "$BUILD_DIR" && GOWORK=off "$GO" test -c "${BUILD_FLAGS[@]}" -o "$TMP/$BINARY" "$BUILD_PKG"); then
  echo "build.sh: FAILED to compile $SUITE_PKG ($VARIANT)" >&2
  exit 1
fi
echo "build.sh: compiled $SUITE_PKG ($VARIANT) in $(( $(date +%s) - start ))s" >&2
if ! (cd "$HERE" && CGO_ENABLED=0 "$GO" build -trimpath -o "$TMP/nxdns" ./nxdns); then
  echo "build.sh: FAILED to build nxdns" >&2
  exit 1
fi
if [[ "$VARIANT" == external ]]; then
  cp "$EXTERNAL_SRC" "$TMP/" # the file of ours that was built in, for the record
  rm -rf "$BUILD_DIR"       # the copy of upstream's files
fi
printf '%s\n%s\n' "$(cd "$HERE" && "$GO" list -m -f '{{.Path}} {{.Version}}' sigs.k8s.io/apiserver-network-proxy sigs.k8s.io/apiserver-network-proxy/konnectivity-client)" "$GOVERSION" > "$TMP/VERSIONS"
cache_commit
