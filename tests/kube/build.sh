#!/usr/bin/env bash
# Builds a real kube-apiserver and etcd from the Go module proxy into a cache
# OUTSIDE the work tree, and prints the cache directory on the last line of stdout.
# Skips the build when the cache entry is already complete. Durations go to stderr.
#
#   ${XDG_CACHE_HOME:-$HOME/.cache}/konnectivity-kube/<key>/
#     kube-apiserver   k8s.io/kubernetes/cmd/kube-apiserver   (tests/kube/go.mod)
#     kube-proxy       k8s.io/kubernetes/cmd/kube-proxy       (the same module: the proxy tests'
#                      upstream side; its build reuses the apiserver's package cache)
#     etcd             go.etcd.io/etcd/server/v3              (tests/kube/etcd/go.mod)
#     VERSIONS         what was built, with which Go
#
# key = pinned versions + sha256 of both go.mod/go.sum + this script + go version.
# Builds happen in a temp dir next to the entry and are renamed into place when
# complete; concurrent callers serialise on a lock file (tests/lib/build-cache.sh, shared with
# tests/interop/build.sh). Builds run one at a time,
# under nice -n 10 (the cold kube-apiserver build takes ~8-9 min on 2 cores).
#
# Env: GO (go binary), GOMODCACHE/GOCACHE (honoured), KUBE_BUILD_NICE (default 10).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib/build-cache.sh
source "$HERE/../lib/build-cache.sh"
GO="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
NICE="${KUBE_BUILD_NICE:-10}"

KUBE_VERSION="v1.37.2"   # newest stable k8s.io/kubernetes on the module proxy; staging modules at v0.37.2
ETCD_VERSION="v3.7.3"    # newest stable etcd server; kubernetes v1.37 uses the etcd v3.7 client

# Never download a toolchain, never touch go.mod/go.sum: the checked-in go.sum is the contract.
export GOTOOLCHAIN=local
export GOFLAGS="-mod=readonly -buildvcs=false"
export CGO_ENABLED=0

for v in KUBE_VERSION:"k8s.io/kubernetes $KUBE_VERSION" ETCD_VERSION:"go.etcd.io/etcd/server/v3 $ETCD_VERSION"; do
  want="${v#*:}"
  if ! grep -rqF "$want" "$HERE/go.mod" "$HERE/etcd/go.mod"; then
    echo "build.sh: ${v%%:*} does not match go.mod (expected '$want')" >&2
    exit 1
  fi
done

GOVERSION="$("$GO" env GOVERSION)"
SUM="$(cat "$HERE/go.mod" "$HERE/go.sum" "$HERE/etcd/go.mod" "$HERE/etcd/go.sum" "$HERE/build.sh" | sha256sum | cut -c1-16)"
KEY="kube-${KUBE_VERSION}_etcd-${ETCD_VERSION}_${GOVERSION}_${SUM}"
cache_setup konnectivity-kube "$KEY" kube-apiserver kube-proxy etcd
cache_reuse_or_lock

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

build() { # <module dir> <output name> <package> [ldflags]
  local dir="$1" name="$2" pkg="$3" ldflags="${4:-}" start log
  log="$TMP/$name.build.log"
  start=$(now)
  echo "build.sh: building $name ($pkg) ..." >&2
  if ! (cd "$dir" && nice -n "$NICE" "$GO" build -trimpath -ldflags "-s -w $ldflags" -o "$TMP/$name" "$pkg") >"$log" 2>&1; then
    echo "build.sh: FAILED to build $name: (cd $dir && $GO build -trimpath -o $name $pkg)" >&2
    cat "$log" >&2
    exit 1
  fi
  printf 'build.sh: built %-15s in %6ss\n' "$name" "$(secs "$start" "$(now)")" >&2
  rm -f "$log"
}

T0=$(now)
MINOR="${KUBE_VERSION#v1.}"; MINOR="${MINOR%%.*}"
build "$HERE" kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver \
  "-X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$MINOR -X k8s.io/component-base/version.gitTreeState=clean"
build "$HERE" kube-proxy k8s.io/kubernetes/cmd/kube-proxy \
  "-X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$MINOR -X k8s.io/component-base/version.gitTreeState=clean"
build "$HERE/etcd" etcd go.etcd.io/etcd/server/v3 \
  "-X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD_VERSION"

{
  echo "kube-apiserver k8s.io/kubernetes $KUBE_VERSION (staging modules v0.${MINOR}.${KUBE_VERSION##*.})"
  echo "kube-proxy k8s.io/kubernetes $KUBE_VERSION"
  echo "etcd go.etcd.io/etcd/server/v3 $ETCD_VERSION"
  echo "go $GOVERSION"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) in $(secs "$T0" "$(now)")s"
} >"$TMP/VERSIONS"
printf 'build.sh: total %ss\n' "$(secs "$T0" "$(now)")" >&2
cache_commit
