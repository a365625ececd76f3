# %post (konnectivity-server .rpm). $1 = 1 on first install, >= 2 on upgrade.
# Never starts the service: certificates and the config have to be in place first.
if [ ! -e /etc/konnectivity/pki ]; then
	install -d -o root -g konnectivity -m 0750 /etc/konnectivity/pki || :
fi
if [ -d /run/systemd/system ]; then
	systemctl daemon-reload >/dev/null 2>&1 || :
fi
if [ "$1" -eq 1 ]; then
	# %systemd_post: follow the distribution's preset policy (RHEL/Fedora default: disabled).
	# Enable explicitly with: systemctl enable --now konnectivity-server
	systemctl --no-reload preset konnectivity-server.socket konnectivity-server.service >/dev/null 2>&1 || :
	echo "konnectivity-server: installed, not started. Put certificates in /etc/konnectivity/pki/,"
	echo "  review /etc/konnectivity/server.toml, then: systemctl enable --now konnectivity-server"
fi
exit 0
