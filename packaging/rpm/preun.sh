# %preun (konnectivity-server .rpm). $1 = 0 on erase, >= 1 on upgrade.
# %systemd_preun: stop and disable on erase only; an upgrade leaves the running server alone.
if [ "$1" -eq 0 ]; then
	systemctl --no-reload disable --now konnectivity-server.socket konnectivity-server.service >/dev/null 2>&1 || :
fi
exit 0
