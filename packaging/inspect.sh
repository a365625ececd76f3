#!/usr/bin/env bash
# Prints and checks the contents of the packages built by packaging/build.sh.
#
#   packaging/inspect.sh [DEB] [RPM]
#
# Defaults: target/packages/konnectivity-server_<Cargo.toml version>-1_<arch>.deb and
# target/packages/konnectivity-server-<version>-1.<arch>.rpm. Pass "-" to skip one.
# Fails (exit 1) if a required file, mode, owner, conffile / %config(noreplace) flag or
# maintainer script is missing. The rpm is only inspected (no RPM-based system runs here).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="$(sed -n 's/^version *= *"\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -n1)"
DEB="${1:-$ROOT/target/packages/konnectivity-server_${VERSION}-1_$(dpkg --print-architecture).deb}"
RPM="${2:-$ROOT/target/packages/konnectivity-server-${VERSION}-1.$(uname -m).rpm}"

FAILS=0
ok()   { printf '  ok    %s\n' "$*"; }
bad()  { printf '  FAIL  %s\n' "$*"; FAILS=$((FAILS + 1)); }
section() { printf '\n=== %s\n' "$*"; }

# path  mode(ls -l style)  owner:group
REQUIRED=(
  "/usr/bin/konnectivity-server                               -rwxr-xr-x root:root"
  "/usr/lib/systemd/system/konnectivity-server.service        -rw-r--r-- root:root"
  "/usr/lib/systemd/system/konnectivity-server.socket         -rw-r--r-- root:root"
  "/usr/lib/sysusers.d/konnectivity-server.conf               -rw-r--r-- root:root"
  "/etc/konnectivity/server.toml                              -rw-r----- root:*"
  "/etc/default/konnectivity-server                           -rw-r--r-- root:root"
  "/usr/share/doc/konnectivity-server/README.md               -rw-r--r-- root:root"
  "/usr/share/doc/konnectivity-server/CHANGELOG.md            -rw-r--r-- root:root"
  "/usr/share/doc/konnectivity-server/server.toml             -rw-r--r-- root:root"
  "/usr/share/doc/konnectivity-server/examples/10-notify-reload.conf -rw-r--r-- root:root"
)
CONFFILES=(/etc/konnectivity/server.toml /etc/default/konnectivity-server)
DOCS=(README.md CHANGELOG.md)

check_entry() { # <listing: "mode owner:group path" lines> <path> <mode> <owner:group pattern>
  local listing="$1" path="$2" mode="$3" og="$4" line m o
  line="$(awk -v p="$path" '$3 == p' <<<"$listing")"
  if [[ -z "$line" ]]; then bad "missing $path"; return; fi
  read -r m o _ <<<"$line"
  # shellcheck disable=SC2053
  if [[ "$m" == "$mode" && "$o" == $og ]]; then ok "$m $o $path"
  else bad "$path is $m $o, want $mode $og"; fi
}

# ------------------------------------------------------------------------------------ deb ----
if [[ "$DEB" != "-" ]]; then
  section "deb: $DEB ($(stat -c %s "$DEB" 2>/dev/null || echo '?') bytes)"
  if [[ ! -f "$DEB" ]]; then bad "no such file $DEB"; else
    echo "--- dpkg-deb -I"; dpkg-deb -I "$DEB"
    echo "--- dpkg-deb -c"; dpkg-deb -c "$DEB"
    CTRL="$(mktemp -d)"; trap 'rm -rf "$CTRL"' EXIT
    dpkg-deb -e "$DEB" "$CTRL"
    echo "--- conffiles"; cat "$CTRL/conffiles" 2>/dev/null || true
    for s in postinst prerm postrm; do echo "--- $s"; cat "$CTRL/$s" 2>/dev/null || true; done
    echo "--- checks"
    # "mode owner:group path" from the tar listing (./etc/x -> /etc/x; owners are numeric).
    LISTING="$(dpkg-deb --fsys-tarfile "$DEB" | tar -tvf - --numeric-owner \
      | awk '{split($2, og, "/"); u = (og[1] == 0 ? "root" : og[1]); g = (og[2] == 0 ? "root" : og[2]);
              p = $6; sub(/^\./, "", p); print $1, u ":" g, p}')"
    for r in "${REQUIRED[@]}"; do
      read -r path mode og <<<"$r"
      check_entry "$LISTING" "$path" "$mode" "$og"
    done
    for c in "${CONFFILES[@]}"; do
      if grep -qx "$c" "$CTRL/conffiles" 2>/dev/null; then ok "conffile $c"; else bad "not a conffile: $c"; fi
    done
    for s in postinst prerm postrm; do
      if [[ -x "$CTRL/$s" ]]; then ok "maintainer script $s (executable)"; else bad "missing/non-executable $s"; fi
    done
    grep -q 'deb-systemd-helper enable' "$CTRL/postinst" && ok "postinst enables the unit" || bad "postinst does not enable the unit"
    grep -q 'systemd-sysusers' "$CTRL/postinst" && grep -q 'adduser' "$CTRL/postinst" \
      && ok "postinst creates the user (systemd-sysusers, adduser fallback)" || bad "postinst user creation"
    grep -q 'chown root:"\$USER" "\$CONF"' "$CTRL/postinst" && ok "postinst sets group konnectivity on the config" || bad "postinst config group"
    # Code only (comments and echoed notices mention `systemctl restart` for the operator).
    if grep -v -E '^[[:space:]]*(#|echo)' "$CTRL/postinst" | grep -Eq 'deb-systemd-invoke (start|restart)|systemctl (start|restart)'; then
      bad "postinst starts/restarts the service unconditionally"
    else ok "postinst never starts; restart only via try-restart on opt-in"; fi
    grep -q 'deb-systemd-invoke stop' "$CTRL/prerm" && ok "prerm stops on remove" || bad "prerm does not stop"
    grep -q 'SOCKET=konnectivity-server.socket' "$CTRL/postinst" && grep -q 'SOCKET' "$CTRL/prerm" \
      && ok "postinst enables and prerm stops the socket unit too" || bad "socket unit not handled by the maintainer scripts"
    grep -Eq '^[[:space:]]*[a-z|-]*upgrade[a-z|-]*\)' "$CTRL/prerm" && bad "prerm acts on upgrade" || ok "prerm leaves the service alone on upgrade"
    grep -q 'rm -f /etc/konnectivity/server.toml' "$CTRL/postrm" && ok "postrm purge removes the config" || bad "postrm purge"
    dpkg-deb -f "$DEB" Package | grep -qx konnectivity-server && ok "Package: konnectivity-server" || bad "Package field"
    # Unit lint without a running systemd: a copy of the packaged unit whose Exec* point at the
    # packaged binary (systemd-analyze verify fails on missing executables).
    echo "--- systemd-analyze (packaged unit, binary from the package)"
    X="$CTRL/x"; dpkg-deb -x "$DEB" "$X"
    sed "s|/usr/bin/konnectivity-server|$X/usr/bin/konnectivity-server|g" \
      "$X/usr/lib/systemd/system/konnectivity-server.service" >"$CTRL/konnectivity-server.service"
    if VERIFY="$(systemd-analyze verify "$CTRL/konnectivity-server.service" 2>&1)" && [[ -z "$VERIFY" ]]; then
      ok "systemd-analyze verify: clean"
    else bad "systemd-analyze verify: $VERIFY"; fi
    SCORE="$(systemd-analyze security --offline=yes "$CTRL/konnectivity-server.service" 2>&1 | tail -n 1)"
    echo "  info  systemd-analyze security --offline=yes: $SCORE"
  fi
fi

# ------------------------------------------------------------------------------------ rpm ----
if [[ "$RPM" != "-" ]]; then
  section "rpm: $RPM ($(stat -c %s "$RPM" 2>/dev/null || echo '?') bytes)"
  if [[ ! -f "$RPM" ]]; then bad "no such file $RPM"
  elif ! command -v rpm >/dev/null; then bad "rpm not installed (apt-get install rpm)"
  else
    echo "--- rpm -qpi"; rpm -qpi "$RPM"
    echo "--- rpm -qpl"; rpm -qpl "$RPM"
    echo "--- rpm -qp --configfiles"; rpm -qp --configfiles "$RPM"
    echo "--- rpm -qp --scripts"; rpm -qp --scripts "$RPM"
    echo "--- rpm -qpR"; rpm -qpR "$RPM"
    echo "--- checks"
    LISTING="$(rpm -qp --queryformat '[%{FILEMODES:perms} %{FILEUSERNAME}:%{FILEGROUPNAME} %{FILENAMES}\n]' "$RPM")"
    FLAGS="$(rpm -qp --queryformat '[%{FILEFLAGS:fflags} %{FILENAMES}\n]' "$RPM")"
    for r in "${REQUIRED[@]}"; do
      read -r path mode og <<<"$r"
      [[ "$path" == /etc/konnectivity/server.toml ]] && og="root:konnectivity"
      check_entry "$LISTING" "$path" "$mode" "$og"
    done
    CONFIGS="$(rpm -qp --configfiles "$RPM")"
    for c in "${CONFFILES[@]}"; do
      f="$(awk -v p="$c" '$2 == p {print $1}' <<<"$FLAGS")"
      if grep -qx "$c" <<<"$CONFIGS" && [[ "$f" == *c* && "$f" == *n* ]]; then ok "%config(noreplace) $c"
      else bad "$c is not %config(noreplace) (flags '$f')"; fi
    done
    for d in "${DOCS[@]}"; do
      f="$(awk -v p="/usr/share/doc/konnectivity-server/$d" '$2 == p {print $1}' <<<"$FLAGS")"
      [[ "$f" == *d* ]] && ok "%doc $d" || bad "$d is not %doc"
    done
    SCRIPTS="$(rpm -qp --scripts "$RPM")"
    for s in preinstall postinstall preuninstall postuninstall; do
      grep -q "^$s scriptlet" <<<"$SCRIPTS" && ok "$s scriptlet" || bad "missing $s scriptlet"
    done
    grep -q 'systemctl --no-reload disable --now' <<<"$SCRIPTS" && ok "preun stops+disables on erase" || bad "preun"
    grep -q 'try-restart' <<<"$SCRIPTS" && ok "postun: try-restart only on opt-in" || bad "postun upgrade policy"
  fi
fi

echo
if [[ $FAILS -gt 0 ]]; then echo "inspect.sh: $FAILS check(s) FAILED"; exit 1; fi
echo "inspect.sh: all checks passed"
