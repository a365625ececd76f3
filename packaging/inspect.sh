#!/usr/bin/env bash
# Prints and checks the contents of the packages built by packaging/build.sh.
#
#   packaging/inspect.sh [PACKAGE_FILE...]
#
# Default: the six packages of the Cargo.toml version in target/packages/:
# {konnectivity-server,konnectivity-agent,kube-proxy}_<ver>-1_<arch>.deb and
# {konnectivity-server,konnectivity-agent,kube-proxy}-<ver>-1.<arch>.rpm. Each file's package
# is read from the file itself; "-" is skipped.
# Fails (exit 1) if a required file, mode, owner, conffile / %config(noreplace) flag,
# dependency or maintainer script is missing; if `systemd-analyze verify` finds anything in a
# unit (the socket unit included); if a unit's exposure score in `systemd-analyze security` is
# above its package's MAX_EXPOSURE below, or the agent's differs from the server's; if a
# packaged binary contains a build-machine path (cargo registry, checkout, toolchain); if
# lintian --pedantic reports anything not overridden (packaging/lintian/<package>, shipped);
# or if rpmlint reports anything not filtered (packaging/rpmlint.toml). The rpms are only
# inspected and linted (no RPM-based system runs here).
set -euo pipefail

# The hardening baselines: `systemd-analyze security --offline=yes` of the packaged units on
# systemd 252 (packaging/README.md, "Hardening score"): both Konnectivity units score 1.2;
# kube-proxy's scores higher, for what a node's proxy must keep (root with CAP_NET_ADMIN and
# CAP_NET_RAW, the host's network and user namespaces, AF_NETLINK). A higher score is a
# regression: a hardening line lost or weakened. Lower them when the units get stricter.
declare -A MAX_EXPOSURE=([konnectivity-server]=1.2 [konnectivity-agent]=1.2 [kube-proxy]=1.9)

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="$(sed -n 's/^version *= *"\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -n1)"
if [[ $# -eq 0 ]]; then
  P="$ROOT/target/packages" A="$(dpkg --print-architecture)" M="$(uname -m)"
  set -- "$P/konnectivity-server_${VERSION}-1_$A.deb" "$P/konnectivity-agent_${VERSION}-1_$A.deb" \
    "$P/kube-proxy_${VERSION}-1_$A.deb" \
    "$P/konnectivity-server-${VERSION}-1.$M.rpm" "$P/konnectivity-agent-${VERSION}-1.$M.rpm" \
    "$P/kube-proxy-${VERSION}-1.$M.rpm"
fi

FAILS=0
ok()   { printf '  ok    %s\n' "$*"; }
bad()  { printf '  FAIL  %s\n' "$*"; FAILS=$((FAILS + 1)); }
section() { printf '\n=== %s\n' "$*"; }
TMP="$(mktemp -d)"; trap 'rm -rf "$TMP"' EXIT
declare -A SCORE=()

# What each package must hold: REQUIRED ("path mode(ls -l style) owner:group"; group "@" is the
# package's system user), CONFFILES, DOCS (under /usr/share/doc/<package>/), SYSUSER, CONF,
# UNITS (in the order the scripts enable and stop them), DEPENDS (packages it must depend on,
# besides the libraries'), TMPFILES (a tmpfiles.d file the scripts apply).
expect() { # <package>
  local doc="/usr/share/doc/$1"
  DEPENDS=() TMPFILES=""
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
    kube-proxy)
      # root with the unit's capabilities: no system user; the config holds no secret.
      SYSUSER=root CONF=/etc/kubernetes/kube-proxy.toml
      UNITS="kube-proxy.service"
      DEPENDS=(nftables) TMPFILES=kube-proxy.conf
      REQUIRED=(
        "/usr/bin/kube-proxy                                        -rwxr-xr-x root:root"
        "/usr/lib/systemd/system/kube-proxy.service                 -rw-r--r-- root:root"
        "/usr/lib/tmpfiles.d/kube-proxy.conf                        -rw-r--r-- root:root"
        "/etc/kubernetes/kube-proxy.toml                            -rw-r--r-- root:root"
        "/etc/default/kube-proxy                                    -rw-r--r-- root:root"
        "$doc/kube-proxy.toml                                       -rw-r--r-- root:root"
        "/usr/share/man/man8/kube-proxy-trace.8.gz                  -rw-r--r-- root:root"
      ) ;;
    *) bad "unknown package '$1'"; return 1 ;;
  esac
  REQUIRED+=("$doc/README.md -rw-r--r-- root:root" "$doc/PACKAGING.md -rw-r--r-- root:root"
             "/usr/share/man/man8/$1.8.gz -rw-r--r-- root:root"
             "/usr/share/man/man5/$1.toml.5.gz -rw-r--r-- root:root"
             "/usr/share/bash-completion/completions/$1 -rw-r--r-- root:root"
             "/usr/share/fish/vendor_completions.d/$1.fish -rw-r--r-- root:root")
  # Where the formats differ: Debian's compressed changelogs, DEP-5 copyright and zsh
  # vendor directory; RPM's license directory and zsh site-functions.
  DEB_REQUIRED=("$doc/changelog.gz -rw-r--r-- root:root" "$doc/changelog.Debian.gz -rw-r--r-- root:root"
                "$doc/copyright -rw-r--r-- root:root"
                "/usr/share/zsh/vendor-completions/_$1 -rw-r--r-- root:root"
                "/usr/share/lintian/overrides/$1 -rw-r--r-- root:root")
  RPM_REQUIRED=("$doc/CHANGELOG.md -rw-r--r-- root:root" "/usr/share/licenses/$1/copyright -rw-r--r-- root:root"
                "/usr/share/zsh/site-functions/_$1 -rw-r--r-- root:root")
  CONFFILES=("$CONF" "/etc/default/$1")
  DOCS=(README.md CHANGELOG.md PACKAGING.md)
}

# No absolute build-machine path in a binary (packaging/release-env.sh remaps them): the
# cargo registry and git checkouts, this checkout, the toolchain. Checked on the packaged
# (stripped) binary, as installed.
check_paths() { # <binary> <label>
  local bin="$1" label="$2" p hits=()
  local pats=("/.cargo/registry/" "/.cargo/git/" "$ROOT/" "/.rustup/toolchains/")
  [[ -n "${CARGO_HOME:-}" ]] && pats+=("$CARGO_HOME/")
  for p in "${pats[@]}"; do
    if strings -n 8 "$bin" | grep -qF -- "$p"; then
      hits+=("$p ($(strings -n 8 "$bin" | grep -cF -- "$p") strings, e.g. $(strings -n 8 "$bin" | grep -F -- "$p" | head -n1 | cut -c1-120))")
    fi
  done
  if [[ ${#hits[@]} -eq 0 ]]; then ok "$label: no build-machine path (${pats[*]})"
  else for p in "${hits[@]}"; do bad "$label: embeds $p"; done; fi
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
  local pkg="$1" x="$2" dir="$TMP/units-$1" unit f name out score max
  mkdir -p "$dir"; unit="$dir/$pkg.service"
  # Every unit the package ships (the socket unit too), side by side so that a socket's
  # Service= resolves; verify loads the units next to the ones it is given.
  for f in "$x"/usr/lib/systemd/system/*; do
    name="$(basename "$f")"
    sed "s|/usr/bin/$pkg|$x/usr/bin/$pkg|g" "$f" >"$dir/$name"
    # ConditionPathExists= is not checked by verify; Documentation=file:// is.
    if out="$(systemd-analyze verify "$dir/$name" 2>&1)" && [[ -z "$out" ]]; then
      ok "systemd-analyze verify $name: clean"
    else bad "systemd-analyze verify $name: $out"; fi
  done
  SCORE[$pkg]="$(systemd-analyze security --offline=yes "$unit" 2>&1 | tail -n 1 | sed 's/.*exposure level for [^:]*: *//')"
  score="${SCORE[$pkg]%% *}" max="${MAX_EXPOSURE[$pkg]}"
  if [[ "$score" =~ ^[0-9]+(\.[0-9]+)?$ ]] && awk -v s="$score" -v m="$max" 'BEGIN { exit !(s <= m) }'; then
    ok "systemd-analyze security --offline=yes $pkg.service: ${SCORE[$pkg]} (at most $max)"
  else bad "systemd-analyze security --offline=yes $pkg.service: '${SCORE[$pkg]}', above the baseline $max (a hardening regression)"; fi
}

# lintian at its strictest (pedantic, info and experimental tags): anything it prints that is
# not overridden in the package's shipped override file fails.
lint_deb() { # <file>
  local out
  if ! command -v lintian >/dev/null; then bad "lintian not installed (apt-get install lintian)"; return; fi
  echo "--- lintian --pedantic -I -E"
  out="$(lintian --pedantic -I -E --no-tag-display-limit "$1" 2>&1)" || true
  [[ -n "$out" ]] && sed 's/^/  | /' <<<"$out"
  if [[ -z "$(grep -E '^[EWIPX]: ' <<<"$out")" ]]; then ok "lintian --pedantic -I -E: nothing reported (overrides: packaging/lintian/$pkg)"
  else bad "lintian: $(grep -cE '^[EWIPX]: ' <<<"$out") finding(s) not overridden"; fi
}
lint_rpm() { # <file>
  local out
  if ! command -v rpmlint >/dev/null; then bad "rpmlint not installed (apt-get install rpmlint)"; return; fi
  echo "--- rpmlint -c packaging/rpmlint.toml"
  out="$(rpmlint -c "$ROOT/packaging/rpmlint.toml" "$1" 2>&1)" || true
  sed 's/^/  | /' <<<"$out"
  # "1 packages and 0 specfiles checked; 0 errors, 0 warnings, 12 filtered, 0 badness; ..."
  if grep -Eq ' 0 errors, 0 warnings' <<<"$out"; then ok "rpmlint: no error or warning that is not filtered"
  else bad "rpmlint: findings not filtered in packaging/rpmlint.toml"; fi
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
  for r in "${REQUIRED[@]}" "${DEB_REQUIRED[@]}"; do
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
  local dep depends
  depends="$(dpkg-deb -f "$deb" Depends)"
  for dep in "${DEPENDS[@]}"; do
    grep -Eq "(^|, )$dep( |,|$)" <<<"$depends" && ok "Depends: $dep" || bad "Depends lacks $dep: $depends"
  done
  if [[ -n "$TMPFILES" ]]; then
    grep -qx "TMPFILES=\"\?$TMPFILES\"\?" <<<"$postinst" && grep -q 'systemd-tmpfiles --create "$TMPFILES"' <<<"$postinst" \
      && ok "postinst applies /usr/lib/tmpfiles.d/$TMPFILES" || bad "postinst does not apply $TMPFILES"
  fi
  grep -q 'systemd-sysusers' <<<"$postinst" && grep -q 'useradd' <<<"$postinst" \
    && ok "postinst creates the user (systemd-sysusers, useradd fallback)" || bad "postinst user creation"
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
  check_paths "$x/usr/bin/$pkg" "/usr/bin/$pkg"
  echo "--- systemd-analyze (packaged units, binary from the package)"
  analyze_unit "$pkg" "$x"
  lint_deb "$deb"
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
  for r in "${REQUIRED[@]}" "${RPM_REQUIRED[@]}"; do
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
  local dep requires
  requires="$(rpm -qpR "$rpm")"
  for dep in "${DEPENDS[@]}"; do
    grep -Eq "^$dep( |$)" <<<"$requires" && ok "Requires: $dep" || bad "Requires lacks $dep"
  done
  if [[ -n "$TMPFILES" ]]; then
    grep -q 'systemd-tmpfiles --create "$TMPFILES"' <<<"$scripts" && grep -qx "TMPFILES=\"\?$TMPFILES\"\?" <<<"$scripts" \
      && ok "%post applies /usr/lib/tmpfiles.d/$TMPFILES" || bad "%post does not apply $TMPFILES"
  fi
  lint_rpm "$rpm"
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

# The agent's idle-code list (src/bin/konnectivity-agent.symbol-order, see build.rs) names
# functions by their mangled names, whose hashes change with a dependency, its features or the
# toolchain; a name this build lacks is skipped without a word, and an idle agent holds more
# of its code resident. Read from the release build's unstripped binary, the one packaged.
AGENT_BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release/konnectivity-agent"
if [[ -x "$AGENT_BIN" ]] && command -v nm >/dev/null; then
  section "the agent's idle-code list against the release binary"
  listed="$(grep -v '^#' "$ROOT/src/bin/konnectivity-agent.symbol-order" | sort -u)"
  found="$(comm -12 <(printf '%s\n' "$listed") <(nm --defined-only "$AGENT_BIN" | awk '{print $3}' | sort -u) | wc -l)"
  total="$(printf '%s\n' "$listed" | grep -c .)"
  if (( found * 100 >= total * 90 )); then ok "$found of $total listed functions are in $AGENT_BIN"
  else bad "only $found of $total listed functions are in $AGENT_BIN: regenerate the list (benches/profile/agent-order.sh)"; fi
fi

echo
if [[ $FAILS -gt 0 ]]; then echo "inspect.sh: $FAILS check(s) FAILED"; exit 1; fi
echo "inspect.sh: all checks passed"
