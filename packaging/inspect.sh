#!/usr/bin/env bash
# Prints and checks the contents of the packages built by packaging/build.sh.
#
#   packaging/inspect.sh [PACKAGE_FILE...]
#
# Default: the four packages of the Cargo.toml version in target/packages/:
# konnectivity-server_<ver>-1_<arch>.deb, konnectivity-agent_<ver>-1_<arch>.deb,
# konnectivity-server-<ver>-1.<arch>.rpm, konnectivity-agent-<ver>-1.<arch>.rpm. Each file's
# package (server or agent) is read from the file itself; "-" is skipped.
# Fails (exit 1) if a required file, mode, owner, conffile / %config(noreplace) flag or
# maintainer script is missing, or if the agent's unit scores differently from the server's in
# `systemd-analyze security`. The rpms are only inspected (no RPM-based system runs here).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="$(sed -n 's/^version *= *"\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -n1)"
if [[ $# -eq 0 ]]; then
  P="$ROOT/target/packages" A="$(dpkg --print-architecture)" M="$(uname -m)"
  set -- "$P/konnectivity-server_${VERSION}-1_$A.deb" "$P/konnectivity-agent_${VERSION}-1_$A.deb" \
    "$P/konnectivity-server-${VERSION}-1.$M.rpm" "$P/konnectivity-agent-${VERSION}-1.$M.rpm"
fi

FAILS=0
ok()   { printf '  ok    %s\n' "$*"; }
bad()  { printf '  FAIL  %s\n' "$*"; FAILS=$((FAILS + 1)); }
section() { printf '\n=== %s\n' "$*"; }
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
declare -A SCORE=()

# What each package must hold: REQUIRED ("path mode(ls -l style) owner:group"; group "@" is the
# package's system user), CONFFILES, DOCS (under /usr/share/doc/<package>/), SYSUSER, CONF,
# UNITS (in the order the scripts enable and stop them).
expect() { # <package>
  local doc="/usr/share/doc/$1"
  case "$1" in
    konnectivity-server)
      SYSUSER=konnectivity CONF=/etc/konnectivity/server.toml
      UNITS="konnectivity-server.socket konnectivity-server.service"
      REQUIRED=(
        "/usr/bin/konnectivity-server                               -rwxr-xr-x root:root"
        "/usr/lib/systemd/system/konnectivity-server.service        -rw-r--r-- root:root"
        "/usr/lib/systemd/system/konnectivity-server.socket         -rw-r--r-- root:root"
        "/usr/lib/sysusers.d/konnectivity-server.conf               -rw-r--r-- root:root"
        "/etc/konnectivity/server.toml                              -rw-r----- root:@"
        "/etc/default/konnectivity-server                           -rw-r--r-- root:root"
        "$doc/server.toml                                           -rw-r--r-- root:root"
        "$doc/examples/10-notify-reload.conf                        -rw-r--r-- root:root"
      ) ;;
    konnectivity-agent)
      SYSUSER=konnectivity-agent CONF=/etc/konnectivity/agent.toml
      UNITS="konnectivity-agent.service"
      REQUIRED=(
        "/usr/bin/konnectivity-agent                                -rwxr-xr-x root:root"
        "/usr/lib/systemd/system/konnectivity-agent.service         -rw-r--r-- root:root"
        "/usr/lib/sysusers.d/konnectivity-agent.conf                -rw-r--r-- root:root"
        "/etc/konnectivity/agent.toml                               -rw-r----- root:@"
        "/etc/default/konnectivity-agent                            -rw-r--r-- root:root"
        "$doc/agent.toml                                            -rw-r--r-- root:root"
      ) ;;
    *) bad "unknown package '$1'"; return 1 ;;
  esac
  REQUIRED+=("$doc/README.md -rw-r--r-- root:root" "$doc/CHANGELOG.md -rw-r--r-- root:root"
             "$doc/PACKAGING.md -rw-r--r-- root:root")
  CONFFILES=("$CONF" "/etc/default/$1")
  DOCS=(README.md CHANGELOG.md PACKAGING.md)
}

check_entry() { # <listing: "mode owner:group path" lines> <path> <mode> <owner:group pattern>
  local listing="$1" path="$2" mode="$3" og="$4" line m o
  line="$(awk -v p="$path" '$3 == p' <<<"$listing")"
  if [[ -z "$line" ]]; then bad "missing $path"; return; fi
  read -r m o _ <<<"$line"
  # shellcheck disable=SC2053
  if [[ "$m" == "$mode" && "$o" == $og ]]; then ok "$m $o $path"
  else bad "$path is $m $o, want $mode $og"; fi
}

# The rendered scripts: each carries its package's variables, no template marker is left.
check_vars() { # <package> <label> <script text>
  if grep -qx "PKG=$1" <<<"$3" && grep -qx "USER=$SYSUSER" <<<"$3" && ! grep -qx '#@PACKAGE_VARS@' <<<"$3"; then
    ok "$2: rendered for $1 (PKG=$1, USER=$SYSUSER)"
  else bad "$2: not rendered for $1 (PKG=/USER= missing or #@PACKAGE_VARS@ left)"; fi
}

# Unit lint without a running systemd: a copy of the packaged unit whose Exec* point at the
# packaged binary (systemd-analyze verify fails on missing executables).
analyze_unit() { # <package> <extracted payload dir>
  local pkg="$1" x="$2" unit="$TMP/$1.service" out
  sed "s|/usr/bin/$pkg|$x/usr/bin/$pkg|g" "$x/usr/lib/systemd/system/$pkg.service" >"$unit"
  # ConditionPathExists= is not checked by verify; Documentation=file:// is.
  if out="$(systemd-analyze verify "$unit" 2>&1)" && [[ -z "$out" ]]; then
    ok "systemd-analyze verify $pkg.service: clean"
  else bad "systemd-analyze verify $pkg.service: $out"; fi
  SCORE[$pkg]="$(systemd-analyze security --offline=yes "$unit" 2>&1 | tail -n 1 | sed 's/.*exposure level for [^:]*: *//')"
  echo "  info  systemd-analyze security --offline=yes $pkg.service: ${SCORE[$pkg]}"
}

inspect_deb() { # <file>
  local deb="$1" pkg ctrl x listing c s r path mode og
  pkg="$(dpkg-deb -f "$deb" Package)"
  section "deb $pkg: $deb ($(stat -c %s "$deb") bytes)"
  expect "$pkg" || return 0
  ctrl="$TMP/deb-$pkg"; rm -rf "$ctrl"; mkdir -p "$ctrl"
  echo "--- dpkg-deb -I"; dpkg-deb -I "$deb"
  echo "--- dpkg-deb -c"; dpkg-deb -c "$deb"
  dpkg-deb -e "$deb" "$ctrl/DEBIAN"
  echo "--- conffiles"; cat "$ctrl/DEBIAN/conffiles" 2>/dev/null || true
  for s in postinst prerm postrm; do echo "--- $s"; cat "$ctrl/DEBIAN/$s" 2>/dev/null || true; done
  echo "--- checks"
  # "mode owner:group path" from the tar listing (./etc/x -> /etc/x; owners are numeric).
  listing="$(dpkg-deb --fsys-tarfile "$deb" | tar -tvf - --numeric-owner \
    | awk '{split($2, og, "/"); u = (og[1] == 0 ? "root" : og[1]); g = (og[2] == 0 ? "root" : og[2]);
            p = $6; sub(/^\./, "", p); print $1, u ":" g, p}')"
  for r in "${REQUIRED[@]}"; do
    read -r path mode og <<<"$r"
    # The payload's group is root (dpkg has no such user yet); postinst sets it.
    [[ "$og" == root:@ ]] && og="root:*"
    check_entry "$listing" "$path" "$mode" "$og"
  done
  for c in "${CONFFILES[@]}"; do
    if grep -qx "$c" "$ctrl/DEBIAN/conffiles" 2>/dev/null; then ok "conffile $c"; else bad "not a conffile: $c"; fi
  done
  for s in postinst prerm postrm; do
    if [[ -x "$ctrl/DEBIAN/$s" ]]; then ok "maintainer script $s (executable)"; else bad "missing/non-executable $s"; continue; fi
    check_vars "$pkg" "$s" "$(cat "$ctrl/DEBIAN/$s")"
  done
  local postinst prerm postrm
  postinst="$(cat "$ctrl/DEBIAN/postinst" 2>/dev/null)"; prerm="$(cat "$ctrl/DEBIAN/prerm" 2>/dev/null)"
  postrm="$(cat "$ctrl/DEBIAN/postrm" 2>/dev/null)"
  grep -qx "UNITS=\"$UNITS\"" <<<"$postinst" && grep -qx "UNITS=\"$UNITS\"" <<<"$prerm" \
    && grep -qx "UNITS=\"$UNITS\"" <<<"$postrm" && ok "scripts handle the units $UNITS" || bad "scripts: UNITS is not \"$UNITS\""
  grep -q 'deb-systemd-helper enable' <<<"$postinst" && ok "postinst enables the units" || bad "postinst does not enable the units"
  grep -q 'systemd-sysusers' <<<"$postinst" && grep -q 'adduser' <<<"$postinst" \
    && ok "postinst creates the user (systemd-sysusers, adduser fallback)" || bad "postinst user creation"
  grep -q 'chown root:"\$USER" "\$CONF"' <<<"$postinst" && grep -qx "CONF=$CONF" <<<"$postinst" \
    && ok "postinst sets group $SYSUSER on $CONF" || bad "postinst config group"
  # Code only (comments and echoed notices mention `systemctl restart` for the operator).
  if grep -v -E '^[[:space:]]*(#|echo)' <<<"$postinst" | grep -Eq 'deb-systemd-invoke (start|restart)|systemctl (start|restart)'; then
    bad "postinst starts/restarts the service unconditionally"
  else ok "postinst never starts; restart only via try-restart on opt-in"; fi
  grep -q 'deb-systemd-invoke stop' <<<"$prerm" && ok "prerm stops on remove" || bad "prerm does not stop"
  grep -Eq '^[[:space:]]*[a-z|-]*upgrade[a-z|-]*\)' <<<"$prerm" && bad "prerm acts on upgrade" || ok "prerm leaves the service alone on upgrade"
  grep -q 'rm -f "\$CONF"' <<<"$postrm" && grep -qx "CONF=$CONF" <<<"$postrm" && ok "postrm purge removes $CONF" || bad "postrm purge"
  x="$ctrl/x"; dpkg-deb -x "$deb" "$x"
  echo "--- systemd-analyze (packaged unit, binary from the package)"
  analyze_unit "$pkg" "$x"
}

inspect_rpm() { # <file>
  local rpm="$1" pkg listing flags configs scripts f c d s r path mode og
  if ! command -v rpm >/dev/null; then bad "rpm not installed (apt-get install rpm): cannot inspect $rpm"; return; fi
  pkg="$(rpm -qp --queryformat '%{NAME}' "$rpm")"
  section "rpm $pkg: $rpm ($(stat -c %s "$rpm") bytes)"
  expect "$pkg" || return 0
  echo "--- rpm -qpi"; rpm -qpi "$rpm"
  echo "--- rpm -qpl"; rpm -qpl "$rpm"
  echo "--- rpm -qp --configfiles"; rpm -qp --configfiles "$rpm"
  echo "--- rpm -qp --scripts"; rpm -qp --scripts "$rpm"
  echo "--- rpm -qpR"; rpm -qpR "$rpm"
  echo "--- checks"
  listing="$(rpm -qp --queryformat '[%{FILEMODES:perms} %{FILEUSERNAME}:%{FILEGROUPNAME} %{FILENAMES}\n]' "$rpm")"
  flags="$(rpm -qp --queryformat '[%{FILEFLAGS:fflags} %{FILENAMES}\n]' "$rpm")"
  for r in "${REQUIRED[@]}"; do
    read -r path mode og <<<"$r"
    og="${og/@/$SYSUSER}"
    check_entry "$listing" "$path" "$mode" "$og"
  done
  configs="$(rpm -qp --configfiles "$rpm")"
  for c in "${CONFFILES[@]}"; do
    f="$(awk -v p="$c" '$2 == p {print $1}' <<<"$flags")"
    if grep -qx "$c" <<<"$configs" && [[ "$f" == *c* && "$f" == *n* ]]; then ok "%config(noreplace) $c"
    else bad "$c is not %config(noreplace) (flags '$f')"; fi
  done
  for d in "${DOCS[@]}"; do
    f="$(awk -v p="/usr/share/doc/$pkg/$d" '$2 == p {print $1}' <<<"$flags")"
    [[ "$f" == *d* ]] && ok "%doc $d" || bad "$d is not %doc"
  done
  for s in PREIN POSTIN PREUN POSTUN; do
    scripts="$(rpm -qp --queryformat "%{$s}" "$rpm")"
    if [[ -n "$scripts" && "$scripts" != "(none)" ]]; then check_vars "$pkg" "%${s,,} scriptlet" "$scripts"
    else bad "missing %${s,,} scriptlet"; fi
  done
  scripts="$(rpm -qp --scripts "$rpm")"
  grep -qx "UNITS=\"$UNITS\"" <<<"$scripts" && ok "scriptlets handle the units $UNITS" || bad "scriptlets: UNITS is not \"$UNITS\""
  grep -q 'systemctl --no-reload disable --now' <<<"$scripts" && ok "preun stops+disables on erase" || bad "preun"
  grep -q 'try-restart' <<<"$scripts" && ok "postun: try-restart only on opt-in" || bad "postun upgrade policy"
}

for f in "$@"; do
  [[ "$f" == - ]] && continue
  if [[ ! -f "$f" ]]; then section "$f"; bad "no such file $f"; continue; fi
  case "$f" in
    *.deb) inspect_deb "$f" ;;
    *.rpm) inspect_rpm "$f" ;;
    *) section "$f"; bad "neither .deb nor .rpm: $f" ;;
  esac
done

if [[ -n "${SCORE[konnectivity-server]:-}" && -n "${SCORE[konnectivity-agent]:-}" ]]; then
  section "hardening: the agent's unit scores as the server's"
  s="${SCORE[konnectivity-server]}" a="${SCORE[konnectivity-agent]}"
  [[ "${s%% *}" == "${a%% *}" ]] && ok "systemd-analyze security: server $s, agent $a" \
    || bad "systemd-analyze security: server $s, agent $a (must be the same)"
fi

echo
if [[ $FAILS -gt 0 ]]; then echo "inspect.sh: $FAILS check(s) FAILED"; exit 1; fi
echo "inspect.sh: all checks passed"
