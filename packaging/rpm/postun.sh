# %postun (konnectivity-server .rpm). $1 = 0 on erase, >= 1 on upgrade.
# Upgrade policy (packaging/README.md): no restart that drops live tunnels unless
# KONNECTIVITY_RESTART_ON_UPGRADE=yes in /etc/default/konnectivity-server.
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || :
fi
if [ "$1" -ge 1 ]; then
	if systemctl --quiet is-active konnectivity-server.service 2>/dev/null; then
		v=$(sed -n 's/^[[:space:]]*KONNECTIVITY_RESTART_ON_UPGRADE=["'\'']\{0,1\}\([A-Za-z0-9]*\).*/\1/p' \
			/etc/default/konnectivity-server 2>/dev/null | tail -n 1)
		case "$v" in
		[Yy][Ee][Ss]|[Tt][Rr][Uu][Ee]|1)
			systemctl try-restart konnectivity-server.service >/dev/null 2>&1 || : ;;
		*)
			echo "konnectivity-server: upgraded, NOT restarted (live tunnels stay up on the previous binary)."
			echo "  Restart when convenient: systemctl restart konnectivity-server" ;;
		esac
	fi
else
	# Erase: rpm removed unmodified config files (modified ones are kept as *.rpmsave).
	rm -rf /run/konnectivity-server
	rmdir /etc/konnectivity/pki 2>/dev/null || :
	rmdir /etc/konnectivity 2>/dev/null || :
fi
exit 0
