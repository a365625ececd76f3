//! upstream's messages for refused values, word for word (checked against upstream
//! v1.37.2's own output for the same command lines).

use super::harness::run;

#[test]
fn upstreams_validation_messages() {
    let cases: &[(&[&str], &str)] = &[
        (&["--proxy-mode=userspace"], "failed validate: KubeProxyConfiguration.Mode.ProxyMode: Invalid value: \"userspace\": must be iptables, ipvs, nftables or blank (blank means the best-available proxy [currently iptables])"),
        (&["--proxy-mode=kernelspace"], "failed validate: KubeProxyConfiguration.Mode.ProxyMode: Invalid value: \"kernelspace\": must be iptables, ipvs, nftables or blank (blank means the best-available proxy [currently iptables])"),
        (&["--iptables-sync-period=0"], "failed validate: [KubeProxyConfiguration.SyncPeriod: Invalid value: \"0s\": must be greater than 0, KubeProxyConfiguration.SyncPeriod: Invalid value: \"1s\": must be greater than or equal to KubeProxyConfiguration.MinSyncPeriod]"),
        (&["--iptables-min-sync-period=1m"], "failed validate: KubeProxyConfiguration.SyncPeriod: Invalid value: \"1m0s\": must be greater than or equal to KubeProxyConfiguration.MinSyncPeriod"),
        (&["--iptables-min-sync-period=-1s"], "failed validate: KubeProxyConfiguration.MinSyncPeriod: Invalid value: \"-1s\": must be greater than or equal to 0"),
        (&["--config-sync-period=0s"], "failed validate: KubeProxyConfiguration.ConfigSyncPeriod: Invalid value: \"0s\": must be greater than 0"),
        (&["--kube-api-burst=-1"], "failed validate: KubeProxyConfiguration.ClientConnection.Burst: Invalid value: -1: must be greater than or equal to 0"),
        (&["--oom-score-adj=2000", "--iptables-masquerade-bit=40"], "failed validate: [KubeProxyConfiguration.KubeProxyIPTablesConfiguration.MasqueradeBit: Invalid value: 40: must be within the range [0, 31], KubeProxyConfiguration.KubeProxyLinuxConfiguration.OOMScoreAdj: Invalid value: 2000: must be within the range [-1000, 1000]]"),
        (&["--conntrack-min=-1", "--conntrack-tcp-timeout-established=-1s"], "failed validate: [KubeProxyConfiguration.KubeProxyLinuxConfiguration.KubeProxyConntrackConfiguration.Min: Invalid value: -1: must be greater than or equal to 0, KubeProxyConfiguration.KubeProxyLinuxConfiguration.KubeProxyConntrackConfiguration.TCPEstablishedTimeout: Invalid value: \"-1s\": must be greater than or equal to 0]"),
        (&["--proxy-mode=ipvs", "--ipvs-tcp-timeout=-1s", "--ipvs-exclude-cidrs=10.0.0.0/8,nope"], "failed validate: [KubeProxyConfiguration.KubeProxyIPVSConfiguration.TCPTimeout: Invalid value: \"-1s\": must be greater than or equal to 0, KubeProxyConfiguration.KubeProxyIPVSConfiguration.ExcludeCidrs[1]: Invalid value: \"nope\": must be a valid CIDR]"),
        (&["--feature-gates=Foo=true"], "failed complete: unrecognized feature gate: Foo"),
        (&["--feature-gates=KubeProxyIPVS=false", "--proxy-mode=ipvs"], "failed validate: KubeProxyConfiguration.Mode.ProxyMode: Invalid value: \"ipvs\": must be iptables, nftables or blank (blank means the best-available proxy [currently iptables])"),
        (&["--detect-local-mode=Foo"], "failed validate: KubeProxyConfiguration.DetectLocalMode: Unsupported value: \"Foo\": supported values: \"ClusterCIDR\", \"NodeCIDR\", \"BridgeInterface\", \"InterfaceNamePrefix\", \"\""),
        (&["--detect-local-mode=BridgeInterface"], "failed validate: KubeProxyConfiguration.DetectLocalConfiguration.InterfaceName: Invalid value: \"\": must not be empty"),
        (&["--detect-local-mode=InterfaceNamePrefix"], "failed validate: KubeProxyConfiguration.DetectLocalConfiguration.InterfacePrefix: Invalid value: \"\": must not be empty"),
        (&["--cluster-cidr=10.0.0.0/8,10.1.0.0/16"], "failed validate: KubeProxyConfiguration.DetectLocalConfiguration.ClusterCIDRs: Invalid value: [\"10.0.0.0/8\",\"10.1.0.0/16\"]: must be a either a single CIDR or dual-stack pair of CIDRs (e.g. [10.100.0.0/16, fde4:8dba:82e1::/48]"),
        (&["--cluster-cidr=10.0.0.0/33"], "failed validate: KubeProxyConfiguration.DetectLocalConfiguration.ClusterCIDRs[0]: Invalid value: \"10.0.0.0/33\": must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)"),
        (&["--nodeport-addresses=primary,primary,foo"], "failed validate: [KubeProxyConfiguration.NodePortAddresses[1]: Duplicate value: \"primary\", KubeProxyConfiguration.NodePortAddresses[2]: Invalid value: \"foo\": must be a valid CIDR or one of the keywords 'primary', 'localhost', 'all']"),
        (&["--show-hidden-metrics-for-version=1.2"], "failed validate: KubeProxyConfiguration.ShowHiddenMetricsForVersion: Invalid value: \"1.2\": invalid showHiddenMetricsForVersion: showHiddenMetricsForVersion: Invalid value: \"1.2\": must be omitted or have the value '1.36'; only the previous minor version is allowed"),
        (&["--metrics-port=0"], "failed validate: KubeProxyConfiguration.MetricsBindAddress: Invalid value: \"\": must be IP:port"),
        (&["--logging-format=foo"], "initialize logging: logging.format: Invalid value: \"foo\": Unsupported log format"),
        (&["--log-flush-frequency=0"], "initialize logging: logging.flushFrequency: Invalid value: \"0s\": Must be greater than zero"),
        (&["--log-text-split-stream"], "initialize logging: logging.options.text.splitStream: Forbidden: Feature LoggingAlphaOptions is disabled"),
        (&["--cluster-cidr="], "failed validate: KubeProxyConfiguration.DetectLocalConfiguration.ClusterCIDRs[0]: Invalid value: \"\": must be a valid CIDR block (e.g. 10.100.0.0/16 or fde4:8dba:82e1::/48)"),
        (&["--feature-gates=DisableNodeKubeProxyVersion=false"], "failed complete: cannot set feature gate DisableNodeKubeProxyVersion to false, feature is locked to true"),
        (&["--logging-format=json", "--vmodule=a=1"], "initialize logging: logging.vmodule: Forbidden: Only supported for text log format"),
        (&["--hostname-override= "], "failed complete: empty hostname-override is invalid"),
        (&["--proxy-mode=ipvs", "--ipvs-scheduler=lc"], "--ipvs-scheduler (ipvs.scheduler) \"lc\" is not supported: use rr, wrr, sh or mh (empty means rr)"),
    ];
    for (args, message) in cases {
        let result = run(args, &[]);
        assert_eq!(result.code, 1, "{args:?}: {}", result.stderr);
        assert!(
            result.stderr.contains(&format!("Error: {message}\n")),
            "{args:?}:\nwant: {message}\ngot: {}",
            result.stderr
        );
    }
    // The scheduler is only checked in ipvs mode, and upstream's four are accepted.
    assert_eq!(run(&["--ipvs-scheduler=lc", "--check-config"], &[]).code, 0);
    for scheduler in ["rr", "wrr", "sh", "mh", ""] {
        let flag = format!("--ipvs-scheduler={scheduler}");
        assert_eq!(
            run(&["--proxy-mode=ipvs", &flag, "--check-config"], &[]).code,
            0,
            "{scheduler}"
        );
    }
}

#[test]
fn bad_flag_values_read_as_pflag_words_them() {
    let cases: &[(&str, &str)] = &[
        ("--bind-address=foo", "invalid argument \"foo\" for \"--bind-address\" flag: \"foo\" is not a valid IP address"),
        ("--healthz-bind-address=1.2.3.4:x", "invalid argument \"1.2.3.4:x\" for \"--healthz-bind-address\" flag: \"x\" is not a valid number"),
        ("--v=-1", "invalid argument \"-1\" for \"-v, --v\" flag: strconv.ParseUint: parsing \"-1\": invalid syntax"),
        ("--vmodule=x", "invalid argument \"x\" for \"--vmodule\" flag: \"x\" does not have the pattern=N format"),
        ("--kube-api-qps=x", "invalid argument \"x\" for \"--kube-api-qps\" flag: strconv.ParseFloat: parsing \"x\": invalid syntax"),
        ("--conntrack-min=4294967296", "invalid argument \"4294967296\" for \"--conntrack-min\" flag: strconv.ParseInt: parsing \"4294967296\": value out of range"),
        ("--feature-gates=A", "invalid argument \"A\" for \"--feature-gates\" flag: malformed pair, expect string=bool"),
        ("--version=v1.38.0", "invalid argument \"v1.38.0\" for \"--version\" flag: version \"v1.38.0\" must match major/minor/patch of default version \"v1.37.2\""),
        ("--nope", "unknown flag: --nope"),
    ];
    for (arg, message) in cases {
        let result = run(&[arg], &[]);
        assert_eq!(result.code, 1, "{arg}");
        // component-base prints the usage first, then the error.
        assert!(
            result.stderr.starts_with("Usage:\n  kube-proxy [flags]\n"),
            "{arg}: {}",
            result.stderr
        );
        assert!(
            result.stderr.ends_with(&format!("\n\nError: {message}\n")),
            "{arg}:\nwant: {message}\ngot: {}",
            result.stderr
        );
    }
    let result = run(&["foo"], &[]);
    assert_eq!(result.code, 1);
    assert_eq!(
        result.stderr,
        "Error: \"kube-proxy\" does not take any arguments, got [\"foo\"]\n"
    );
}

#[test]
fn settings_only_a_file_can_give_are_validated_in_upstreams_words() {
    // Each expected message is upstream v1.37.2's for the same file.
    let cases = [
        ("invalid-settings.yaml", "failed validate: [KubeProxyConfiguration.KubeProxyNFTablesConfiguration.MasqueradeBit: Invalid value: 32: must be within the range [0, 31], KubeProxyConfiguration.KubeProxyLinuxConfiguration.KubeProxyConntrackConfiguration.UDPStreamTimeout: Invalid value: \"-5s\": must be greater than or equal to 0, KubeProxyConfiguration.MinSyncPeriod: Invalid value: \"-1s\": must be greater than or equal to 0, KubeProxyConfiguration.HealthzBindAddress: Invalid value: \"0\": must be a valid port, KubeProxyConfiguration.MetricsBindAddress: Invalid value: \"foo\": must be a valid IP, KubeProxyConfiguration.NodePortAddresses[1]: Invalid value: \"::/129\": must be a valid CIDR or one of the keywords 'primary', 'localhost', 'all', KubeProxyConfiguration.DetectLocalConfiguration.ClusterCIDRs: Invalid value: [\"10.0.0.0/8\",\"fd00::/64\",\"10.1.0.0/16\"]: must be a either a single CIDR or dual-stack pair of CIDRs (e.g. [10.100.0.0/16, fde4:8dba:82e1::/48]]"),
        ("invalid-logging.yaml", "initialize logging: [logging.format: Forbidden: Log format json is disabled, see LoggingBetaOptions feature, logging.verbosity: Invalid value: 3000000000: Must be <= 2147483647, logging.vmodule: Forbidden: Only supported for text log format, logging.vmodule[0]: Required value: File pattern must not be empty, logging.vmodule[1]: Invalid value: \"a=b\": File pattern must not contain equal sign or comma, logging.options.text.infoBufferSize: Forbidden: Feature LoggingAlphaOptions is disabled]"),
        ("invalid-ipvs.yaml", "failed validate: [KubeProxyConfiguration.KubeProxyIPVSConfiguration.TCPFinTimeout: Invalid value: \"-1s\": must be greater than or equal to 0, KubeProxyConfiguration.KubeProxyIPVSConfiguration.UDPTimeout: Invalid value: \"-2s\": must be greater than or equal to 0, KubeProxyConfiguration.SyncPeriod: Invalid value: \"10s\": must be greater than or equal to KubeProxyConfiguration.MinSyncPeriod]"),
    ];
    for (file, message) in cases {
        let config = format!("--config={}", super::harness::fixture(file).display());
        let result = run(&[&config], &[]);
        assert_eq!(result.code, 1, "{file}: {}", result.stderr);
        assert!(
            result.stderr.contains(&format!("Error: {message}\n")),
            "{file}:\nwant: {message}\ngot: {}",
            result.stderr
        );
    }
}
