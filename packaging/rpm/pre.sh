# %pre template for the .rpm packages (packaging/build.sh replaces #@PACKAGE_VARS@ with
# packaging/vars/<package>): create the static system user/group before the payload is
# unpacked, so $CONF gets group $USER (mode 0640). Same definition as
# /usr/lib/sysusers.d/$PKG.conf (%sysusers_create_compat).
#@PACKAGE_VARS@
if ! getent passwd "$USER" >/dev/null 2>&1; then
	if command -v systemd-sysusers >/dev/null 2>&1; then
		echo "u $USER - \"$DESCRIPTION\" /var/lib/$PKG -" | \
			systemd-sysusers --replace="/usr/lib/sysusers.d/$PKG.conf" - || :
	fi
	if ! getent passwd "$USER" >/dev/null 2>&1; then
		getent group "$USER" >/dev/null 2>&1 || groupadd -r "$USER"
		useradd -r -g "$USER" -d "/var/lib/$PKG" -M \
			-s /sbin/nologin -c "$DESCRIPTION" "$USER"
	fi
fi
exit 0
