# %pre (konnectivity-server .rpm): create the static system user/group before the payload is
# unpacked, so /etc/konnectivity/server.toml gets group "konnectivity" (mode 0640).
# Same definition as /usr/lib/sysusers.d/konnectivity-server.conf (%sysusers_create_compat).
if ! getent passwd konnectivity >/dev/null 2>&1; then
	if command -v systemd-sysusers >/dev/null 2>&1; then
		echo 'u konnectivity - "Konnectivity proxy server" /var/lib/konnectivity-server -' | \
			systemd-sysusers --replace=/usr/lib/sysusers.d/konnectivity-server.conf - || :
	fi
	if ! getent passwd konnectivity >/dev/null 2>&1; then
		getent group konnectivity >/dev/null 2>&1 || groupadd -r konnectivity
		useradd -r -g konnectivity -d /var/lib/konnectivity-server -M \
			-s /sbin/nologin -c "Konnectivity proxy server" konnectivity
	fi
fi
exit 0
