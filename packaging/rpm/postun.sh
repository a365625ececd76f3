# %postun template for the .rpm packages (packaging/build.sh replaces #@PACKAGE_VARS@ with
# packaging/vars/<package>). $1 = 0 on erase, >= 1 on upgrade.
# Upgrade policy (packaging/README.md): restart on upgrade when $RESTART_VAR in
# /etc/default/$PKG says yes ($RESTART_DEFAULT when unset: no for the Konnectivity packages,
# whose restarts drop live tunnels; yes for kube-proxy, whose rules stay in the kernel).
#@PACKAGE_VARS@
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || :
fi
if [ "$1" -ge 1 ]; then
	if systemctl --quiet is-active "$PKG.service" 2>/dev/null; then
		v=$(sed -n "s/^[[:space:]]*$RESTART_VAR=[\"']\{0,1\}\([A-Za-z0-9]*\).*/\1/p" \
			"/etc/default/$PKG" 2>/dev/null | tail -n 1)
		case "${v:-$RESTART_DEFAULT}" in
		[Yy][Ee][Ss]|[Tt][Rr][Uu][Ee]|1)
			systemctl try-restart "$PKG.service" >/dev/null 2>&1 || : ;;
		*)
			echo "$PKG: upgraded, NOT restarted (it keeps running the previous binary)."
			echo "  Restart when convenient: systemctl restart $PKG" ;;
		esac
	fi
else
	# Erase: rpm removed unmodified config files (modified ones are kept as *.rpmsave).
	rm -rf "/run/$PKG"
	[ -z "$PKI" ] || rmdir "$PKI" 2>/dev/null || :
	rmdir "${CONF%/*}" 2>/dev/null || :
fi
exit 0
