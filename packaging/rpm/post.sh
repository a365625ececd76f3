# %post template for the .rpm packages (packaging/build.sh replaces #@PACKAGE_VARS@ with
# packaging/vars/<package>). $1 = 1 on first install, >= 2 on upgrade.
# Never starts the service: certificates and the config have to be in place first.
#@PACKAGE_VARS@
if [ -n "$PKI" ] && [ ! -e "$PKI" ]; then
	install -d -o root -g "$USER" -m 0750 "$PKI" || :
fi
# %tmpfiles_create: what the package's tmpfiles.d file describes exists before the first start.
if [ -n "$TMPFILES" ]; then
	systemd-tmpfiles --create "$TMPFILES" >/dev/null 2>&1 || :
fi
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || :
fi
if [ "$1" -eq 1 ]; then
	# %systemd_post: follow the distribution's preset policy (RHEL/Fedora default: disabled).
	# Enable explicitly with: systemctl enable --now $PKG
	systemctl --no-reload preset $UNITS >/dev/null 2>&1 || :
	echo "$PKG: installed, not started. $SETUP_NOTE,"
	echo "  then: systemctl enable --now $PKG"
fi
exit 0
