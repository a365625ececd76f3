# %preun template for the .rpm packages (packaging/build.sh replaces #@PACKAGE_VARS@ with
# packaging/vars/<package>). $1 = 0 on erase, >= 1 on upgrade.
# %systemd_preun: stop and disable on erase only; an upgrade leaves the running process alone.
#@PACKAGE_VARS@
if [ "$1" -eq 0 ]; then
	systemctl --no-reload disable --now $UNITS >/dev/null 2>&1 || :
fi
exit 0
