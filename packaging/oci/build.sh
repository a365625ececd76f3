#!/usr/bin/env bash
# Builds the OCI images konnectivity-server:<version>, konnectivity-agent:<version> and
# kube-proxy:<version> (each also tagged :dev) in local podman/buildah storage, from nothing
# pulled: a scratch image holding the stripped binary, exactly the shared libraries `ldd` names
# for it, /etc/passwd, /etc/group and /etc/nsswitch.conf with the nonroot user 65532, a
# writable /tmp and the home /home/nonroot.
#
# kube-proxy's image differs where kubeadm's DaemonSet and the kernel need it to: the binary at
# /usr/local/bin/kube-proxy (the DaemonSet's command), the user root (the DaemonSet gives it
# `privileged: true` and no user; programming the node's nftables needs CAP_NET_ADMIN in its
# network namespace, which a nonroot user does not get from that), no home, and
# /usr/sbin/nft with the libraries ldd names for it, taken from this machine's Debian nftables
# package (the version in a label), with the Debian copyright file of every package a file
# comes from.
#
#   packaging/oci/build.sh [options] [PROGRAM...]
#
#   PROGRAM               server, agent, kube-proxy (default: all three). A missing binary is
#                         an error.
#   --server-binary PATH  default: <target dir>/release/konnectivity-server
#   --agent-binary PATH   default: <target dir>/release/konnectivity-agent
#   --kube-proxy-binary PATH  default: <target dir>/release/kube-proxy
#                         (<target dir> is $CARGO_TARGET_DIR, else target/ of this checkout;
#                         nothing is built here: run `cargo build --release --bins` first)
#   --version V           image tag and version label (default: Cargo.toml's version)
#   --source URL          org.opencontainers.image.source (default: $OCI_SOURCE, else the git
#                         remote `origin` without credentials, else Cargo.toml's repository)
#
# Each image: entrypoint /proxy-server (agent: /proxy-agent), the same binary reachable as
# /usr/bin/proxy-server (/usr/bin/proxy-agent, HyperShift's path), USER 65532:65532,
# HOME=/home/nonroot (kube-proxy: entrypoint /usr/local/bin/kube-proxy, USER 0:0, PATH for
# nft), OCI labels title, description, version, revision (git commit), created (the commit's
# time), source, licenses. The layer is reproducible: same inputs, same digest.
# Needs buildah (Debian package `buildah`); runs as root or rootless. The last stdout lines are
# the image references built (localhost/NAME:VERSION).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"

SERVER_BINARY="$TARGET_DIR/release/konnectivity-server"
AGENT_BINARY="$TARGET_DIR/release/konnectivity-agent"
KUBE_PROXY_BINARY="$TARGET_DIR/release/kube-proxy"
VERSION="" SOURCE="${OCI_SOURCE:-}"
PROGRAMS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --server-binary) SERVER_BINARY="$2"; shift ;;
    --server-binary=*) SERVER_BINARY="${1#*=}" ;;
    --agent-binary) AGENT_BINARY="$2"; shift ;;
    --agent-binary=*) AGENT_BINARY="${1#*=}" ;;
    --kube-proxy-binary) KUBE_PROXY_BINARY="$2"; shift ;;
    --kube-proxy-binary=*) KUBE_PROXY_BINARY="${1#*=}" ;;
    --version) VERSION="$2"; shift ;;
    --version=*) VERSION="${1#*=}" ;;
    --source) SOURCE="$2"; shift ;;
    --source=*) SOURCE="${1#*=}" ;;
    -h|--help) sed -n '2,37p' "$0"; exit 0 ;;
    server|agent|kube-proxy) PROGRAMS+=("$1") ;;
    *) echo "build.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[[ ${#PROGRAMS[@]} -gt 0 ]] || PROGRAMS=(server agent kube-proxy)

log() { printf 'oci/build.sh: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }
command -v buildah >/dev/null || die "buildah not found (apt-get install buildah)"

# --- what goes into the labels -----------------------------------------------------------------
cargo_field() { sed -n "s/^$1 *= *\"\(.*\)\"/\1/p" Cargo.toml | head -n1; }
VERSION="${VERSION:-$(cargo_field version)}"
LICENSE="$(cargo_field license)"
REVISION="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
EPOCH="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || date +%s)}"
CREATED="$(date -u -d "@$EPOCH" +%Y-%m-%dT%H:%M:%SZ)"
if [[ -z "$SOURCE" ]] && origin="$(git remote get-url origin 2>/dev/null)"; then
  # https://user:token@host/x.git -> https://host/x ; git@host:x.git -> https://host/x
  origin="$(sed -E 's#^(https?://)[^/@]*@#\1#; s#^[^/@:]+@([^:/]+):#https://\1/#; s#^ssh://[^/@]*@?([^/:]+)(:[0-9]+)?/#https://\1/#; s#\.git$##' <<<"$origin")"
  [[ "$origin" == http* ]] && SOURCE="$origin"
fi
SOURCE="${SOURCE:-$(cargo_field repository)}"
if [[ -z "$SOURCE" ]]; then
  SOURCE="file://$ROOT"
  log "no git remote 'origin' and no repository in Cargo.toml: source label is $SOURCE (set --source or OCI_SOURCE)"
fi
[[ -n "$VERSION" && -n "$LICENSE" ]] || die "version or license missing from Cargo.toml"

# --- the programs ----------------------------------------------------------------------------
# NAME, BINARY, ENTRY (its path in the image, without the leading /), LINK (a /usr/bin name for
# it, or none), IMAGE_USER, HOME_DIR (none: no home), TOOLS (host programs copied in with their
# libraries, each from a Debian package), LICENSES, DESCRIPTION.
program() { # <server|agent|kube-proxy>
  LINK="" IMAGE_USER=65532:65532 HOME_DIR=/home/nonroot TOOLS=() LICENSES="$LICENSE"
  case "$1" in
    server) NAME=konnectivity-server BINARY="$SERVER_BINARY" ENTRY=proxy-server LINK=usr/bin/proxy-server
            DESCRIPTION="Konnectivity proxy-server (apiserver-network-proxy) drop-in replacement, in Rust" ;;
    agent)  NAME=konnectivity-agent BINARY="$AGENT_BINARY" ENTRY=proxy-agent LINK=usr/bin/proxy-agent
            DESCRIPTION="Konnectivity proxy-agent (apiserver-network-proxy) drop-in replacement, in Rust" ;;
    kube-proxy)
            NAME=kube-proxy BINARY="$KUBE_PROXY_BINARY" ENTRY=usr/local/bin/kube-proxy IMAGE_USER=0:0 HOME_DIR=""
            TOOLS=(/usr/sbin/nft)
            # Ours, and nftables' own (GPL-2); the libraries' are in /usr/share/doc/*/copyright.
            LICENSES="$LICENSE AND GPL-2.0-only"
            DESCRIPTION="kube-proxy (Kubernetes network proxy) drop-in replacement, in Rust, with the nft it programs the node with" ;;
  esac
}
for p in "${PROGRAMS[@]}"; do
  program "$p"
  [[ -x "$BINARY" ]] || die "no $p binary at $BINARY (cargo build --release --bins, or --$p-binary PATH)"
  for t in "${TOOLS[@]}"; do
    [[ -x "$t" ]] || die "$NAME's image needs $t from its Debian package (apt-get install $(basename "$t" | sed 's/^nft$/nftables/'))"
  done
done

WORK="$(mktemp -d)"
CTR=""
cleanup() {
  [[ -n "$CTR" ]] && buildah rm "$CTR" >/dev/null 2>&1
  rm -rf "$WORK"
}
trap cleanup EXIT

# --- rootfs: binary, its libraries, the user database --------------------------------------
# The shared libraries `ldd` names for a binary: the loader (a path) and `name => path` for every
# library; linux-vdso has no file. A static binary prints "not a dynamic executable" /
# "statically linked": no libraries.
ldd_libs() { ldd "$1" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'; }
rootfs() { # <dir>, for the program() set
  local r="$1" lib t f pkg
  install -d -m 0755 "$r" "$r/etc" "$r/usr" "$r/usr/bin"
  install -d -m 1777 "$r/tmp"
  if [[ -n "$HOME_DIR" ]]; then install -d -m 0755 "$r/home" "$r$HOME_DIR"; fi
  install -d -m 0755 "$r/$(dirname "$ENTRY")"
  strip --strip-unneeded -o "$r/$ENTRY" "$BINARY"
  chmod 0755 "$r/$ENTRY"
  if [[ -n "$LINK" ]]; then ln -s "../../$ENTRY" "$r/$LINK"; fi
  : >"$r.libs"; : >"$r.tools"
  for t in "${TOOLS[@]}"; do
    install -d -m 0755 "$r$(dirname "$t")"
    cp -L "$t" "$r$t"; chmod 0755 "$r$t"
    printf '%s\n' "$t" >>"$r.tools"
  done
  for lib in $( { ldd_libs "$BINARY"; for t in "${TOOLS[@]}"; do ldd_libs "$t"; done; } | sort -u); do
    install -d -m 0755 "$r$(dirname "$lib")"
    cp -L "$lib" "$r$lib"
    chmod 0755 "$r$lib"
    printf '%s\n' "$lib" >>"$r.libs"
  done
  # What came from Debian packages comes with their copyright files (nft is GPL-2; its
  # libraries are GPL, LGPL, MIT and BSD). dpkg -S names a library by its path under /lib or
  # /usr/lib (usrmerge: either may be the one recorded).
  if [[ ${#TOOLS[@]} -gt 0 ]]; then
    : >"$r.packages"
    while read -r f; do
      pkg="$(dpkg -S "$f" 2>/dev/null || dpkg -S "$(sed 's#^/lib/#/usr/lib/#; t; s#^/usr/lib/#/lib/#' <<<"$f")" 2>/dev/null)" \
        || die "$f: no Debian package owns it (dpkg -S)"
      printf '%s\n' "${pkg%%:*}" >>"$r.packages"
    done < <(cat "$r.tools" "$r.libs")
    while read -r pkg; do
      install -d -m 0755 "$r/usr/share/doc/$pkg"
      install -m 0644 "/usr/share/doc/$pkg/copyright" "$r/usr/share/doc/$pkg/copyright"
    done < <(sort -u "$r.packages")
  fi
  printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' \
    'nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin' \
    'nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin' >"$r/etc/passwd"
  printf '%s\n' 'root:x:0:' 'nobody:x:65534:' 'nonroot:x:65532:' >"$r/etc/group"
  # Without this file glibc asks DNS before /etc/hosts; the kubelet's /etc/hosts comes first.
  printf '%s\n' 'passwd: files' 'group: files' 'hosts: files dns' >"$r/etc/nsswitch.conf"
  chmod 0644 "$r/etc/passwd" "$r/etc/group" "$r/etc/nsswitch.conf"
  # One archive, root-owned except the home; fixed order and times, so the layer is reproducible.
  local a=(--format=gnu --sort=name --mtime="@$EPOCH" --numeric-owner)
  if [[ -n "$HOME_DIR" ]]; then
    tar -C "$r" "${a[@]}" --owner=0 --group=0 --exclude=".$HOME_DIR" -cf "$r.tar" .
    tar -C "$r" "${a[@]}" --owner="${IMAGE_USER%%:*}" --group="${IMAGE_USER##*:}" -rf "$r.tar" ".$HOME_DIR"
  else
    tar -C "$r" "${a[@]}" --owner=0 --group=0 -cf "$r.tar" .
  fi
}

BUILT=()
for p in "${PROGRAMS[@]}"; do
  program "$p"
  T0=$(date +%s.%N)
  R="$WORK/$p"
  rootfs "$R"
  log "$NAME: /$ENTRY ($(stat -c %s "$R/$ENTRY") bytes stripped)$( [[ -s "$R.tools" ]] && echo " + $(paste -sd' ' "$R.tools")") + $(wc -l <"$R.libs" 2>/dev/null || echo 0) libraries: $(tr '\n' ' ' <"$R.libs" 2>/dev/null)"
  # Labels for the Debian packages the tools come from (their versions).
  TOOL_LABELS=()
  for t in "${TOOLS[@]}"; do
    pkg="$(dpkg -S "$t" 2>/dev/null | cut -d: -f1)"
    TOOL_LABELS+=(--label "com.example.kube-traffic.$(basename "$t").debian-package=$pkg $(dpkg-query -W -f='${Version}' "$pkg" 2>/dev/null)")
  done
  ENV_ARGS=(--env "HOME=${HOME_DIR:-/}")
  [[ ${#TOOLS[@]} -eq 0 ]] || ENV_ARGS+=(--env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin)
  if got="$("$BINARY" --version 2>/dev/null | head -n1)" && [[ -n "$got" && "$got" != *"$VERSION"* ]]; then
    log "warning: $BINARY --version says '$got', the image is labelled $VERSION"
  fi
  CTR="$(buildah from --quiet scratch)"
  buildah add --quiet "$CTR" "$R.tar" / >/dev/null
  buildah config \
    --os linux \
    --user "$IMAGE_USER" \
    --workingdir / \
    "${ENV_ARGS[@]}" \
    --entrypoint "[\"/$ENTRY\"]" \
    --cmd '' \
    --stop-signal SIGTERM \
    --created-by "packaging/oci/build.sh" \
    --label "org.opencontainers.image.title=$NAME" \
    --label "org.opencontainers.image.description=$DESCRIPTION" \
    --label "org.opencontainers.image.version=$VERSION" \
    --label "org.opencontainers.image.revision=$REVISION" \
    --label "org.opencontainers.image.created=$CREATED" \
    --label "org.opencontainers.image.source=$SOURCE" \
    --label "org.opencontainers.image.licenses=$LICENSES" \
    "${TOOL_LABELS[@]}" \
    "$CTR"
  OLD_ID="$(buildah inspect --type image --format '{{.FromImageID}}' "localhost/$NAME:$VERSION" 2>/dev/null || true)"
  OLD_DEV_ID="$(buildah inspect --type image --format '{{.FromImageID}}' "localhost/$NAME:dev" 2>/dev/null || true)"
  ID="$(buildah commit --quiet --rm --timestamp "$EPOCH" "$CTR" "localhost/$NAME:$VERSION")"
  CTR=""
  buildah tag "localhost/$NAME:$VERSION" "localhost/$NAME:dev"
  # A rebuild with other inputs leaves the previous image untagged: remove it (only that one).
  dangling="$(buildah images --noheading --no-trunc --filter dangling=true --format '{{.ID}}' 2>/dev/null | sed 's/^sha256://')"
  for old in $(printf '%s\n' "$OLD_ID" "$OLD_DEV_ID" | sort -u); do
    [[ -n "$old" && "$old" != "$ID" ]] && grep -qx "$old" <<<"$dangling" || continue
    buildah rmi "$old" >/dev/null 2>&1 && log "$NAME: removed the previous image ${old:0:12}, now untagged"
  done
  log "$NAME: built localhost/$NAME:$VERSION and :dev in $(awk -v a="$T0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }') s"
  BUILT+=("localhost/$NAME:$VERSION")
done
printf '%s\n' "${BUILT[@]}"
