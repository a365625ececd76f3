//! `reload`: every reloadable setting changed live, a connection held across the reloads.

use super::*;

/// What a reload test changes, rendered as our TOML or as a KubeProxyConfiguration.
#[derive(Clone)]
pub(crate) struct Knobs {
    kubeconfig: PathBuf,
    nodeport_addresses: Vec<&'static str>,
    masquerade_all: bool,
    cluster_cidr: &'static str,
    tcp_established: &'static str,
    verbosity: u32,
    healthz: &'static str,
    metrics: &'static str,
    sync_period: &'static str,
    min_sync_period: &'static str,
}

impl Knobs {
    fn new(kubeconfig: PathBuf) -> Knobs {
        Knobs {
            kubeconfig,
            nodeport_addresses: vec!["10.0.0.1/32", "fd00:10::1/128"],
            masquerade_all: false,
            cluster_cidr: "10.244.0.0/16,fd00:10:244::/48",
            tcp_established: "24h0m0s",
            verbosity: 2,
            healthz: "0.0.0.0:10256",
            metrics: "127.0.0.1:10249",
            sync_period: "30s",
            min_sync_period: "1s",
        }
    }

    fn toml(&self) -> String {
        format!(
            "# written by tests/kube_proxy_behaviour.rs\n\
             proxy_mode = \"nftables\"\n\
             kubeconfig = \"{}\"\n\
             hostname_override = \"{}\"\n\
             conntrack_max_per_core = 0\n\
             cluster_cidr = \"{}\"\n\
             nodeport_addresses = [{}]\n\
             masquerade_all = {}\n\
             conntrack_tcp_timeout_established = \"{}\"\n\
             v = {}\n\
             healthz_bind_address = \"{}\"\n\
             metrics_bind_address = \"{}\"\n\
             iptables_sync_period = \"{}\"\n\
             iptables_min_sync_period = \"{}\"\n",
            self.kubeconfig.display(),
            kube_proxy::NODE_NAME,
            self.cluster_cidr,
            self.nodeport_addresses
                .iter()
                .map(|a| format!("\"{a}\""))
                .collect::<Vec<_>>()
                .join(", "),
            self.masquerade_all,
            self.tcp_established,
            self.verbosity,
            self.healthz,
            self.metrics,
            self.sync_period,
            self.min_sync_period,
        )
    }

    /// kubeadm's kube-proxy ConfigMap (`config.conf`), with this node's values.
    fn kubeadm_yaml(&self) -> String {
        format!(
            "apiVersion: kubeproxy.config.k8s.io/v1alpha1\n\
             bindAddress: 0.0.0.0\n\
             bindAddressHardFail: false\n\
             clientConnection:\n  acceptContentTypes: \"\"\n  burst: 0\n  contentType: \"\"\n  kubeconfig: {}\n  qps: 0\n\
             clusterCIDR: {}\n\
             configSyncPeriod: 0s\n\
             conntrack:\n  maxPerCore: 0\n  min: null\n  tcpBeLiberal: false\n  tcpCloseWaitTimeout: null\n  tcpEstablishedTimeout: {}\n  udpStreamTimeout: 0s\n  udpTimeout: 0s\n\
             detectLocal:\n  bridgeInterface: \"\"\n  interfaceNamePrefix: \"\"\n\
             detectLocalMode: \"\"\n\
             enableProfiling: false\n\
             healthzBindAddress: \"{}\"\n\
             hostnameOverride: {}\n\
             iptables:\n  localhostNodePorts: null\n  masqueradeAll: false\n  masqueradeBit: null\n  minSyncPeriod: 0s\n  syncPeriod: 0s\n\
             kind: KubeProxyConfiguration\n\
             logging:\n  flushFrequency: 0\n  options:\n    json:\n      infoBufferSize: \"0\"\n    text:\n      infoBufferSize: \"0\"\n  verbosity: {}\n\
             metricsBindAddress: \"{}\"\n\
             mode: nftables\n\
             nftables:\n  masqueradeAll: {}\n  masqueradeBit: null\n  minSyncPeriod: {}\n  syncPeriod: {}\n\
             nodePortAddresses:\n{}\
             oomScoreAdj: null\n\
             portRange: \"\"\n\
             showHiddenMetricsForVersion: \"\"\n",
            self.kubeconfig.display(),
            self.cluster_cidr,
            self.tcp_established,
            self.healthz,
            kube_proxy::NODE_NAME,
            self.verbosity,
            self.metrics,
            self.masquerade_all,
            self.min_sync_period,
            self.sync_period,
            self.nodeport_addresses
                .iter()
                .map(|a| format!("- {a}\n"))
                .collect::<String>(),
        )
    }
}

/// A ConfigMap volume as the kubelet lays it out: `<dir>/<key>` -> `..data/<key>`, `..data`
/// -> a timestamped directory, replaced by an atomic rename of a new `..data` symlink.
pub(crate) struct ConfigMapDir {
    dir: PathBuf,
    key: &'static str,
    version: usize,
}

impl ConfigMapDir {
    fn new(dir: PathBuf, key: &'static str, content: &str) -> ConfigMapDir {
        std::fs::create_dir_all(&dir).unwrap();
        let mut c = ConfigMapDir {
            dir,
            key,
            version: 0,
        };
        c.swap(content);
        std::os::unix::fs::symlink(format!("..data/{key}"), c.dir.join(key)).unwrap();
        c
    }

    fn path(&self) -> PathBuf {
        self.dir.join(self.key)
    }

    /// The kubelet's update: a new directory, a new `..data_tmp` symlink renamed over
    /// `..data`, the old directory removed.
    fn swap(&mut self, content: &str) {
        self.version += 1;
        let name = format!("..2026_12_07_00_00_{:02}.{}", self.version, self.version);
        let new = self.dir.join(&name);
        std::fs::create_dir(&new).unwrap();
        std::fs::write(new.join(self.key), content).unwrap();
        let tmp = self.dir.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&name, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.join("..data")).unwrap();
        if self.version > 1 {
            let old = self.dir.join(format!(
                "..2026_12_07_00_00_{:02}.{}",
                self.version - 1,
                self.version - 1
            ));
            let _ = std::fs::remove_dir_all(old);
        }
    }
}

/// Counts reloads and checks the held connection after each.
pub(crate) struct Reloads {
    i: usize,
    done: usize,
    /// The running process's successful reloads so far: each logs
    /// `"configuration reloaded" reload_generation=N trigger=...`, N counting from 1.
    generation: u64,
    conn: LineConn,
    server: String,
}

impl Reloads {
    /// Waits for the proxy's next successful reload (the next generation, by `trigger`),
    /// then asks the held connection. Waiting for the generation, not for one more line than
    /// were there, keeps a line still on its way to the log from passing for the next one.
    fn wait(&mut self, h: &mut Harness, trigger: &str) {
        self.generation += 1;
        let needle = format!(
            "reload_generation={} trigger=\"{trigger}\"",
            self.generation
        );
        let i = self.i;
        wait_until(
            &format!("reload {} by {trigger}", self.generation),
            Duration::from_secs(20),
            Duration::from_millis(20),
            || {
                log_text(h, i)
                    .lines()
                    .any(|l| l.contains("configuration reloaded") && l.contains(&needle))
                    .then_some(())
            },
        )
        .unwrap_or_else(|e| panic!("{e}; log:\n{}", h.sides[i].proxy.log_tail(20)));
        self.done += 1;
        match self.conn.ask(&format!("reload {}", self.done)) {
            Ok(a) if a.starts_with(&self.server) => {}
            Ok(a) => h.fail(format!("after reload {}: answer {a:?}", self.done)),
            Err(e) => h.fail(format!(
                "the held connection after reload {}: {e}",
                self.done
            )),
        }
    }

    /// Writes `text` to `path` (in place, as an editor or config management would) and
    /// waits for the watcher's reload.
    fn rewrite(&mut self, h: &mut Harness, path: &Path, text: &str) {
        std::fs::write(path, text).unwrap();
        self.wait(h, "file change");
    }

    /// SIGHUP and its reload.
    fn sighup(&mut self, h: &mut Harness) {
        h.sides[self.i].proxy.signal("-HUP");
        self.wait(h, "SIGHUP");
    }

    fn swap(&mut self, h: &mut Harness, cm: &mut ConfigMapDir, text: &str) {
        cm.swap(text);
        self.wait(h, "file change");
    }
}

pub(crate) fn configz(h: &Harness, i: usize, metrics: &str) -> Value {
    let (_, body) = get(h, i, metrics, "/configz").unwrap_or_else(|e| panic!("{e}"));
    let v: Value = serde_json::from_str(&body).unwrap();
    v["kubeproxy.config.k8s.io"].clone()
}

pub(crate) fn sysctl(h: &Harness, i: usize, key: &str) -> String {
    ns_run(&h.sides[i].node.node, &["sysctl", "-n", key])
        .unwrap_or_default()
        .trim()
        .to_string()
}

pub(crate) fn reload(h: &mut Harness) {
    let i = ours(h);
    let vip = "10.96.23.1";
    h.api().create_service(
        &Svc::node_port("rl", vip)
            .port_np("http", Tcp, 80, 8080, 30080)
            .port("line", Tcp, 90, LINE_PORT),
    );
    h.api().create_slice(&echo_slice("rl", &[POD2]));
    let mut k = Knobs::new(h.kubeconfig());
    let file = h.dir().join("kube-proxy.toml");
    std::fs::write(&file, k.toml()).unwrap();
    h.restart_proxy(i, false, &[format!("--config={}", file.display())], &[]);
    h.settle();
    let conn = LineConn::open(&h.sides[i].node.client, sock(vip, 90)).unwrap();
    let server = conn.server.clone();
    let mut r = Reloads {
        i,
        done: 0,
        generation: 0,
        conn,
        server,
    };
    let t0 = Instant::now();
    h.probe(&[
        p("client", "tcp", NODE_IP, 30080, all(&["pod2<-masq"])),
        p("pod1", "tcp", vip, 80, all(&["pod2<-pod1"])),
    ]);

    // nodePortAddresses: the NodePort moves from eth0's address to the pod-side one.
    k.nodeport_addresses = vec!["10.244.1.1/32", "fd00:10:244:1::1/128"];
    r.rewrite(h, &file, &k.toml());
    wait_table(h, i, "nodeport-ips holds 10.244.1.1", |t| {
        t.keys("nodeport-ips") == vec![json!(NODE_POD_SIDE_IP)]
    });
    h.probe(&[
        p("client", "tcp", NODE_IP, 30080, all(&["REFUSED"])),
        p("pod1", "tcp", NODE_POD_SIDE_IP, 30080, all(&["pod2<-masq"])),
    ]);

    // masqueradeAll, by SIGHUP (the write alone also reloads; both are counted).
    k.masquerade_all = true;
    r.rewrite(h, &file, &k.toml());
    r.sighup(h);
    wait_table(h, i, "the masquerade-all rule", |t| {
        t.mentions("masquerade all clusterIP traffic")
    });
    h.probe(&[p("pod1", "tcp", vip, 80, all(&["pod2<-masq"]))]);
    k.masquerade_all = false;
    r.rewrite(h, &file, &k.toml());
    wait_table(h, i, "no masquerade-all rule", |t| {
        !t.mentions("masquerade all clusterIP traffic")
    });
    h.probe(&[p("pod1", "tcp", vip, 80, all(&["pod2<-pod1"]))]);

    // Local-traffic detection: a cluster CIDR that no longer holds the pods makes their
    // Service traffic masqueraded; back again, not.
    k.cluster_cidr = "10.245.0.0/16,fd00:10:245::/48";
    r.rewrite(h, &file, &k.toml());
    wait_table(h, i, "the new cluster CIDR", |t| t.mentions("10.245.0.0"));
    h.probe(&[p("pod1", "tcp", vip, 80, all(&["pod2<-masq"]))]);
    k.cluster_cidr = "10.244.0.0/16,fd00:10:244::/48";
    r.sighup_after_write(h, &file, &k.toml());
    wait_table(h, i, "the old cluster CIDR", |t| {
        t.mentions("10.244.0.0") && !t.mentions("10.245.0.0")
    });
    h.probe(&[p("pod1", "tcp", vip, 80, all(&["pod2<-pod1"]))]);

    // Conntrack: a sysctl of the node's namespace.
    let est = "net.netfilter.nf_conntrack_tcp_timeout_established";
    let was = sysctl(h, i, est);
    k.tcp_established = "2h0m0s";
    r.rewrite(h, &file, &k.toml());
    wait_until(
        "nf_conntrack_tcp_timeout_established 7200",
        Duration::from_secs(10),
        Duration::from_millis(50),
        || (sysctl(h, i, est) == "7200").then_some(()),
    )
    .unwrap_or_else(|e| panic!("{e} (was {was})"));

    // Verbosity: at 0 a sync logs nothing; at 2 it logs "Syncing nftables rules".
    // One sync after each reload lets any line from before it reach the log; the sync
    // after that is the one counted.
    k.verbosity = 0;
    r.rewrite(h, &file, &k.toml());
    h.settle();
    let quiet_before = count_in_log(h, i, "Syncing nftables rules");
    h.settle();
    let quiet_after = count_in_log(h, i, "Syncing nftables rules");
    k.verbosity = 2;
    r.rewrite(h, &file, &k.toml());
    h.settle();
    let loud_after = wait_until(
        "'Syncing nftables rules' at v=2",
        Duration::from_secs(10),
        Duration::from_millis(20),
        || Some(count_in_log(h, i, "Syncing nftables rules")).filter(|n| *n > quiet_after),
    )
    .unwrap_or(quiet_after);
    if quiet_after != quiet_before || loud_after <= quiet_after {
        h.fail(format!(
            "verbosity: 'Syncing nftables rules' lines {quiet_before} -> {quiet_after} at v=0, -> {loud_after} at v=2"
        ));
    }

    // Sync periods: /configz shows the running values (their effect on timing is the
    // nft-failure scenario's).
    k.sync_period = "7s";
    k.min_sync_period = "0s";
    r.rewrite(h, &file, &k.toml());
    let c = configz(h, i, "127.0.0.1:10249");
    let periods = (
        c["nftables"]["syncPeriod"].clone(),
        c["nftables"]["minSyncPeriod"].clone(),
    );
    if periods != (json!("7s"), json!("0s")) {
        h.fail(format!("sync periods after the reload: {periods:?}"));
    }

    // The ports move.
    k.healthz = "0.0.0.0:10266";
    k.metrics = "127.0.0.1:10259";
    r.rewrite(h, &file, &k.toml());
    wait_until(
        "healthz on 10266 and metrics on 10259, the old ports closed",
        Duration::from_secs(15),
        Duration::from_millis(50),
        || {
            let new_ok = get(h, i, "127.0.0.1:10266", "/healthz").is_ok()
                && get(h, i, "127.0.0.1:10259", "/metrics").is_ok();
            let old_gone = get(h, i, "127.0.0.1:10256", "/healthz").is_err()
                && get(h, i, "127.0.0.1:10249", "/metrics").is_err();
            (new_ok && old_gone).then_some(())
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));

    // An invalid file: refused, naming the key and its line; nothing changes.
    let good = k.toml();
    let bad = good.replace("masquerade_all = false", "masquerade_all = \"yes\"");
    let bad_line = bad
        .lines()
        .position(|l| l.starts_with("masquerade_all"))
        .unwrap()
        + 1;
    let refusal = next_refusal(h, i, "the invalid file refused", |_| {
        std::fs::write(&file, &bad).unwrap()
    });
    if !refusal.contains("masquerade_all") || !refusal.contains(&format!("line {bad_line}")) {
        h.fail(format!(
            "the refusal does not name the key masquerade_all and line {bad_line}: {refusal}"
        ));
    }
    note(format!(
        "reload: invalid TOML refused: {}",
        cut(&refusal, 300)
    ));
    if let Err(e) = r.conn.ask("after the invalid file") {
        h.fail(format!("the held connection after the invalid file: {e}"));
    }
    h.settle();
    if !table(h, i, "ip")
        .unwrap()
        .keys("nodeport-ips")
        .contains(&json!(NODE_POD_SIDE_IP))
    {
        h.fail("the invalid file changed the rules".into());
    }
    h.probe(&[p("pod1", "tcp", vip, 80, all(&["pod2<-pod1"]))]);
    r.rewrite(h, &file, &good);

    // The file gone (a volume being remounted) and SIGHUP: refused as well, nothing changes.
    let gone = next_refusal(h, i, "a reload without the file refused", |h| {
        std::fs::remove_file(&file).unwrap();
        h.sides[i].proxy.signal("-HUP");
    });
    note(format!("reload: without the file: {}", cut(&gone, 300)));
    if let Err(e) = r.conn.ask("without the file") {
        h.fail(format!("the held connection without the file: {e}"));
    }
    h.probe(&[p(
        "pod1",
        "tcp",
        NODE_POD_SIDE_IP,
        30080,
        all(&["pod2<-masq"]),
    )]);
    // Back, with a change: the watcher compares contents once a burst of events settles, and
    // the same content as before the removal is rightly no reason to reload.
    k.min_sync_period = "1s";
    r.rewrite(h, &file, &k.toml());

    // Fill up to 20 reloads, alternating SIGHUP and rewrites.
    let mut toggle = false;
    while r.done < 16 {
        if toggle {
            r.sighup(h);
        } else {
            k.min_sync_period = if k.min_sync_period == "0s" {
                "1s"
            } else {
                "0s"
            };
            r.rewrite(h, &file, &k.toml());
        }
        toggle = !toggle;
    }
    let toml_reloads = r.done;
    let toml_time = t0.elapsed();

    // kubeadm's KubeProxyConfiguration in a ConfigMap directory, changed by symlink swaps.
    k = Knobs::new(h.kubeconfig());
    let mut cm = ConfigMapDir::new(
        h.dir().join("kube-proxy-cm"),
        "config.conf",
        &k.kubeadm_yaml(),
    );
    h.restart_proxy(
        i,
        false,
        &[format!("--config={}", cm.path().display())],
        &[],
    );
    h.settle();
    r.generation = 0;
    // The same connection: a restart leaves the rules and conntrack alone.
    if let Err(e) = r.conn.ask("after the restart with the YAML") {
        h.fail(format!("the held connection after the restart: {e}"));
    }
    k.masquerade_all = true;
    k.tcp_established = "3h0m0s";
    k.metrics = "127.0.0.1:10269";
    r.swap(h, &mut cm, &k.kubeadm_yaml());
    wait_table(h, i, "the masquerade-all rule (YAML)", |t| {
        t.mentions("masquerade all clusterIP traffic")
    });
    wait_until(
        "the YAML's sysctl and metrics port",
        Duration::from_secs(15),
        Duration::from_millis(50),
        || {
            (sysctl(h, i, est) == "10800" && get(h, i, "127.0.0.1:10269", "/metrics").is_ok())
                .then_some(())
        },
    )
    .unwrap_or_else(|e| panic!("{e}"));
    h.probe(&[p("pod1", "tcp", vip, 80, all(&["pod2<-masq"]))]);
    k.masquerade_all = false;
    r.swap(h, &mut cm, &k.kubeadm_yaml());
    wait_table(h, i, "no masquerade-all rule (YAML)", |t| {
        !t.mentions("masquerade all clusterIP traffic")
    });
    r.sighup(h);
    // An invalid YAML: a wrong type under conntrack.
    let good_yaml = k.kubeadm_yaml();
    let bad_yaml = good_yaml.replace("  maxPerCore: 0\n", "  maxPerCore: lots\n");
    let bad_line = bad_yaml
        .lines()
        .position(|l| l.contains("maxPerCore"))
        .unwrap()
        + 1;
    let refusal = next_refusal(h, i, "the invalid YAML refused", |_| cm.swap(&bad_yaml));
    if !refusal.contains("maxPerCore") || !refusal.contains(&format!("line {bad_line}")) {
        h.fail(format!(
            "the YAML refusal does not name conntrack.maxPerCore and line {bad_line}: {refusal}"
        ));
    }
    note(format!(
        "reload: invalid YAML refused: {}",
        cut(&refusal, 300)
    ));
    if let Err(e) = r.conn.ask("after the invalid YAML") {
        h.fail(format!("the held connection after the invalid YAML: {e}"));
    }
    h.probe(&[p("pod1", "tcp", vip, 80, all(&["pod2<-pod1"]))]);
    r.swap(h, &mut cm, &good_yaml);
    note(format!(
        "reload: {} reloads in all ({toml_reloads} of our TOML by rewrite and SIGHUP in {:.1} s, {} of the kubeadm YAML by ..data swap and SIGHUP, a restart between them); one TCP connection held through the Service answered after every one",
        r.done,
        toml_time.as_secs_f64(),
        r.done - toml_reloads
    ));
    if r.done < 20 {
        h.fail(format!("only {} reloads", r.done));
    }
    drop(r);
    restart_default(h, i, false, &[], &[]);
}

/// Does `act` (an invalid configuration given), then waits for the reload it causes to be
/// refused: the refusal's log record.
pub(crate) fn next_refusal(
    h: &Harness,
    i: usize,
    what: &str,
    act: impl FnOnce(&Harness),
) -> String {
    let failed_before = count_in_log(h, i, "RELOAD FAILED");
    act(h);
    wait_until(
        what,
        Duration::from_secs(20),
        Duration::from_millis(20),
        || {
            let records = log_records(h, i, "RELOAD FAILED");
            (records.len() > failed_before).then(|| records.last().unwrap().clone())
        },
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

impl Reloads {
    /// A rewrite followed by SIGHUP: two reloads, both counted.
    fn sighup_after_write(&mut self, h: &mut Harness, path: &Path, text: &str) {
        self.rewrite(h, path, text);
        self.sighup(h);
    }
}
