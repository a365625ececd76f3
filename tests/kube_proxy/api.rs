//! The real kube-apiserver (tests/kube/start.sh on the host's loopback), its relay into node
//! namespaces, and an admin client with builders for the objects a kube-proxy reads.
//!
//! No controller-manager runs: EndpointSlices are written by hand, Services have no selector,
//! LoadBalancer ingress is written through the status subresource.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

use super::procs::{self, Proc};

/// The `endpointslice.kubernetes.io/managed-by` value of every slice the harness writes (a
/// value with a `/` is refused with 422).
pub const MANAGED_BY: &str = "side-by-side.kube-traffic.example.com";
/// The port every node namespace reaches the apiserver on, through the relay.
pub const NODE_API_PORT: u16 = 6443;

/// etcd + kube-apiserver from tests/kube/start.sh, stopped by tests/kube/stop.sh on drop.
pub struct Apiserver {
    pub dir: PathBuf,
    pub env: HashMap<String, String>,
}

impl Apiserver {
    /// Starts the fixture in `dir` (which must exist). The Service CIDRs are dual-stack and
    /// outside the node addresses (start.sh's own 10.0.0.0/24 would hold 10.0.0.1, the node).
    pub fn start(dir: &Path) -> Apiserver {
        Apiserver::start_with(dir, &[])
    }

    /// [`start`](Self::start) with more of start.sh's knobs (the benchmarks: `KUBE_BIN_DIR`,
    /// `KUBE_ETCD_DATA` for a populated cluster, `KUBE_START_TIMEOUT`).
    pub fn start_with(dir: &Path, env: &[(&str, &str)]) -> Apiserver {
        let script = super::repo_file("tests/kube/start.sh");
        let out = std::process::Command::new("bash")
            .arg(script)
            .arg(dir)
            .env(
                "KUBE_APISERVER_EXTRA_ARGS",
                "--service-cluster-ip-range=10.96.0.0/16,fd00:10:96::/112",
            )
            .envs(env.iter().copied())
            // start.sh's watchdog stops the fixture if this process dies without Drop.
            .env("KUBE_WATCH_PID", std::process::id().to_string())
            .output()
            .expect("bash runs tests/kube/start.sh");
        // From here on, a failure still stops whatever start.sh left running.
        let mut api = Apiserver {
            dir: dir.to_path_buf(),
            env: HashMap::new(),
        };
        assert!(
            out.status.success(),
            "tests/kube/start.sh failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = std::fs::read_to_string(dir.join("env")).expect("start.sh writes env");
        api.env = text
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        api
    }

    pub fn get(&self, key: &str) -> &str {
        self.env
            .get(key)
            .unwrap_or_else(|| panic!("start.sh's env has no {key}"))
    }

    /// The directory with kube-apiserver, etcd and upstream kube-proxy.
    pub fn bin_dir(&self) -> PathBuf {
        PathBuf::from(self.get("KUBE_BIN_DIR"))
    }

    /// A copy of the admin kubeconfig that points at the relay's end inside a node namespace
    /// (the serving certificate names 127.0.0.1).
    pub fn write_node_kubeconfig(&self, path: &Path) {
        let admin = std::fs::read_to_string(self.get("KUBECONFIG")).expect("admin kubeconfig");
        let url = self.get("APISERVER_URL");
        assert!(admin.contains(url), "admin kubeconfig does not name {url}");
        let node = admin.replace(url, &format!("https://127.0.0.1:{NODE_API_PORT}"));
        std::fs::write(path, node).expect("write node kubeconfig");
    }
}

/// A kube-apiserver process stopped by [`Apiserver::kill_apiserver`]: what starts it again.
pub struct StoppedApiserver {
    argv: Vec<String>,
}

impl Apiserver {
    /// SIGKILLs the kube-apiserver alone (etcd keeps running): the API goes away as when its
    /// node dies. Returns its command line, for [`Apiserver::restart_apiserver`].
    pub fn kill_apiserver(&mut self) -> StoppedApiserver {
        let pid = self.get("APISERVER_PID").to_string();
        let raw = std::fs::read(format!("/proc/{pid}/cmdline"))
            .unwrap_or_else(|e| panic!("kube-apiserver (pid {pid}) is not running: {e}"));
        let argv: Vec<String> = raw
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        assert!(
            argv.first().is_some_and(|a| a.ends_with("/kube-apiserver")),
            "pid {pid} is not the fixture's kube-apiserver: {argv:?}"
        );
        procs::must("kill", &["-KILL", &pid]);
        procs::wait_until(
            "the killed kube-apiserver to be gone",
            Duration::from_secs(10),
            Duration::from_millis(20),
            || {
                // A zombie still has /proc/<pid>; its cmdline is empty.
                let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
                cmd.is_empty().then_some(())
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
        StoppedApiserver { argv }
    }

    /// Starts the kube-apiserver again with the same command line (the same port, the same
    /// etcd), records its new pid where stop.sh and the watchdog read it, and waits for
    /// `/readyz`.
    pub fn restart_apiserver(&mut self, stopped: StoppedApiserver) {
        use std::os::unix::process::CommandExt;
        let log = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(self.get("APISERVER_LOG"))
            .expect("apiserver log");
        // Its own session, as start.sh starts it: it outlives the thread that started it and
        // is stopped by stop.sh (or start.sh's watchdog), not by this process.
        let child = std::process::Command::new(&stopped.argv[0])
            .args(&stopped.argv[1..])
            .stdin(std::process::Stdio::null())
            .stdout(log.try_clone().expect("dup log"))
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("start kube-apiserver again");
        let pid = child.id().to_string();
        // Reaped by whoever waits for it: nobody here; stop.sh signals it by pid.
        std::mem::forget(child);
        let env_path = self.dir.join("env");
        let text = std::fs::read_to_string(&env_path).expect("env");
        let text: Vec<String> = text
            .lines()
            .map(|l| {
                if l.starts_with("APISERVER_PID=") {
                    format!("APISERVER_PID={pid}")
                } else {
                    l.to_string()
                }
            })
            .collect();
        std::fs::write(&env_path, text.join("\n") + "\n").expect("write env");
        self.env.insert("APISERVER_PID".into(), pid);
        let url = format!("{}/readyz", self.get("APISERVER_URL"));
        let auth = format!("Authorization: Bearer {}", self.get("ADMIN_TOKEN"));
        let ca = self.get("CA_CERT").to_string();
        procs::wait_until(
            "the restarted kube-apiserver's /readyz",
            Duration::from_secs(120),
            Duration::from_millis(200),
            || {
                procs::run(
                    "curl",
                    &[
                        "-fsS",
                        "-o",
                        "/dev/null",
                        "--max-time",
                        "2",
                        "--cacert",
                        &ca,
                        "-H",
                        &auth,
                        &url,
                    ],
                )
                .ok()
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
    }
}

impl Drop for Apiserver {
    fn drop(&mut self) {
        let script = super::repo_file("tests/kube/stop.sh");
        let _ = std::process::Command::new("bash")
            .arg(script)
            .arg(&self.dir)
            .output();
    }
}

/// The host half of the relay: a Unix socket that connects to the apiserver's TCP port on the
/// host's loopback. A Unix socket path is reachable from every network namespace, so each
/// node namespace runs the other half ([`node_relay`]) without any change to the host's
/// network configuration.
pub fn host_relay(api: &Apiserver, socket: &Path, log: &Path) -> Proc {
    let port = api.get("APISERVER_PORT");
    let mut p = Proc::start(
        "relay (host)",
        None,
        &[
            "socat",
            "-d",
            &format!("UNIX-LISTEN:{},fork,unlink-early", socket.display()),
            &format!("TCP:127.0.0.1:{port}"),
        ],
        &[],
        log,
    );
    procs::wait_until(
        "the relay's Unix socket",
        Duration::from_secs(10),
        Duration::from_millis(20),
        || socket.exists().then_some(()),
    )
    .unwrap_or_else(|e| panic!("{e}; relay log:\n{}", p.log_tail(10)));
    assert!(p.exited().is_none(), "socat exited:\n{}", p.log_tail(10));
    p
}

/// The node half: 127.0.0.1:6443 inside `ns`, connecting to the host half's socket.
pub fn node_relay(ns: &str, socket: &Path, log: &Path) -> Proc {
    let mut p = Proc::start(
        &format!("relay ({ns})"),
        Some(ns),
        &[
            "socat",
            "-d",
            &format!("TCP-LISTEN:{NODE_API_PORT},bind=127.0.0.1,fork,reuseaddr"),
            &format!("UNIX-CONNECT:{}", socket.display()),
        ],
        &[],
        log,
    );
    procs::wait_until(
        "the relay's listener in the node namespace",
        Duration::from_secs(10),
        Duration::from_millis(20),
        || {
            let ss = procs::ns_run(ns, &["ss", "-Hltn", &format!("sport = :{NODE_API_PORT}")]);
            ss.ok().filter(|s| !s.trim().is_empty()).map(|_| ())
        },
    )
    .unwrap_or_else(|e| panic!("{e}; relay log:\n{}", p.log_tail(10)));
    assert!(p.exited().is_none(), "socat exited:\n{}", p.log_tail(10));
    p
}

// ------------------------------------------------------------------------------- objects

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proto {
    Tcp,
    Udp,
    Sctp,
}

impl Proto {
    pub fn api(self) -> &'static str {
        match self {
            Proto::Tcp => "TCP",
            Proto::Udp => "UDP",
            Proto::Sctp => "SCTP",
        }
    }
    pub fn probe(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
            Proto::Sctp => "sctp",
        }
    }
}

/// A Service, built as JSON (so that every field reads as it does in a manifest).
#[derive(Clone, Debug)]
pub struct Svc(pub Value);

impl Svc {
    fn base(name: &str, ty: &str) -> Svc {
        Svc(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name},
            "spec": {"type": ty, "ports": []},
        }))
    }
    /// type ClusterIP with a fixed IPv4 ClusterIP (fixed, so that rules and reports are
    /// readable and the same on every run).
    pub fn cluster_ip(name: &str, ip: &str) -> Svc {
        let mut s = Svc::base(name, "ClusterIP");
        s.0["spec"]["clusterIP"] = json!(ip);
        s
    }
    pub fn node_port(name: &str, ip: &str) -> Svc {
        let mut s = Svc::cluster_ip(name, ip);
        s.0["spec"]["type"] = json!("NodePort");
        s
    }
    pub fn load_balancer(name: &str, ip: &str) -> Svc {
        let mut s = Svc::cluster_ip(name, ip);
        s.0["spec"]["type"] = json!("LoadBalancer");
        s
    }
    pub fn headless(name: &str) -> Svc {
        let mut s = Svc::base(name, "ClusterIP");
        s.0["spec"]["clusterIP"] = json!("None");
        s
    }
    pub fn external_name(name: &str, host: &str) -> Svc {
        let mut s = Svc::base(name, "ExternalName");
        s.0["spec"]["externalName"] = json!(host);
        s
    }
    /// Dual-stack: `ipFamilyPolicy: RequireDualStack` with the IPv4 ClusterIP first.
    pub fn dual_stack(mut self, v6: &str) -> Svc {
        let v4 = self.0["spec"]["clusterIP"].clone();
        self.0["spec"]["ipFamilyPolicy"] = json!("RequireDualStack");
        self.0["spec"]["ipFamilies"] = json!(["IPv4", "IPv6"]);
        self.0["spec"]["clusterIPs"] = json!([v4, v6]);
        self
    }
    pub fn port(mut self, name: &str, proto: Proto, port: u16, target: u16) -> Svc {
        let p = json!({"name": name, "protocol": proto.api(), "port": port, "targetPort": target});
        self.ports_mut().push(p);
        self
    }
    /// A port with a fixed nodePort.
    pub fn port_np(
        mut self,
        name: &str,
        proto: Proto,
        port: u16,
        target: u16,
        node_port: u16,
    ) -> Svc {
        let p = json!({"name": name, "protocol": proto.api(), "port": port, "targetPort": target,
                       "nodePort": node_port});
        self.ports_mut().push(p);
        self
    }
    fn ports_mut(&mut self) -> &mut Vec<Value> {
        self.0["spec"]["ports"].as_array_mut().expect("ports")
    }
    pub fn external_ips(mut self, ips: &[&str]) -> Svc {
        self.0["spec"]["externalIPs"] = json!(ips);
        self
    }
    pub fn etp_local(mut self) -> Svc {
        self.0["spec"]["externalTrafficPolicy"] = json!("Local");
        self
    }
    pub fn itp_local(mut self) -> Svc {
        self.0["spec"]["internalTrafficPolicy"] = json!("Local");
        self
    }
    pub fn affinity(mut self, timeout_seconds: u32) -> Svc {
        self.0["spec"]["sessionAffinity"] = json!("ClientIP");
        self.0["spec"]["sessionAffinityConfig"] =
            json!({"clientIP": {"timeoutSeconds": timeout_seconds}});
        self
    }
    pub fn source_ranges(mut self, cidrs: &[&str]) -> Svc {
        self.0["spec"]["loadBalancerSourceRanges"] = json!(cidrs);
        self
    }
    pub fn label(mut self, key: &str, value: &str) -> Svc {
        self.0["metadata"]["labels"][key] = json!(value);
        self
    }
    pub fn name(&self) -> String {
        self.0["metadata"]["name"]
            .as_str()
            .expect("name")
            .to_string()
    }
}

/// An endpoint of a slice. By default ready, on `node-a` (the node both proxies run as).
#[derive(Clone, Debug)]
pub struct Ep {
    addr: String,
    node: String,
    ready: Option<bool>,
    serving: Option<bool>,
    terminating: Option<bool>,
}

impl Ep {
    pub fn ready(addr: &str) -> Ep {
        Ep {
            addr: addr.to_string(),
            node: super::NODE_NAME.to_string(),
            ready: Some(true),
            serving: Some(true),
            terminating: Some(false),
        }
    }
    /// Declared on another node (the address may still be one of this node's pods: the proxy
    /// believes the slice).
    pub fn on(mut self, node: &str) -> Ep {
        self.node = node.to_string();
        self
    }
    /// Not ready and not serving (a pod that fails its readiness probe).
    pub fn not_ready(mut self) -> Ep {
        self.ready = Some(false);
        self.serving = Some(false);
        self
    }
    /// Terminating but still serving (a pod in its grace period).
    pub fn terminating_serving(mut self) -> Ep {
        self.ready = Some(false);
        self.serving = Some(true);
        self.terminating = Some(true);
        self
    }
    fn json(&self) -> Value {
        let mut c = serde_json::Map::new();
        for (k, v) in [
            ("ready", self.ready),
            ("serving", self.serving),
            ("terminating", self.terminating),
        ] {
            if let Some(v) = v {
                c.insert(k.to_string(), json!(v));
            }
        }
        json!({"addresses": [self.addr], "conditions": c, "nodeName": self.node})
    }
}

/// An EndpointSlice written by hand, labelled for its Service.
#[derive(Clone, Debug)]
pub struct Slice(pub Value);

impl Slice {
    /// `family` is "IPv4" or "IPv6".
    pub fn new(name: &str, service: &str, family: &str) -> Slice {
        Slice(json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "labels": {
                "kubernetes.io/service-name": service,
                "endpointslice.kubernetes.io/managed-by": MANAGED_BY,
            }},
            "addressType": family,
            "ports": [],
            "endpoints": [],
        }))
    }
    pub fn v4(name: &str, service: &str) -> Slice {
        Slice::new(name, service, "IPv4")
    }
    pub fn port(mut self, name: &str, proto: Proto, port: u16) -> Slice {
        let p = json!({"name": name, "protocol": proto.api(), "port": port});
        self.0["ports"].as_array_mut().expect("ports").push(p);
        self
    }
    pub fn ep(mut self, ep: Ep) -> Slice {
        self.0["endpoints"]
            .as_array_mut()
            .expect("endpoints")
            .push(ep.json());
        self
    }
    pub fn label(mut self, key: &str, value: &str) -> Slice {
        self.0["metadata"]["labels"][key] = json!(value);
        self
    }
    pub fn name(&self) -> String {
        self.0["metadata"]["name"]
            .as_str()
            .expect("name")
            .to_string()
    }
}

// ------------------------------------------------------------------------------- client

/// The admin client, blocking (the harness is synchronous; its own runtime drives kube).
pub struct Kube {
    rt: tokio::runtime::Runtime,
    client: kube::Client,
    pub ns: String,
}

impl Kube {
    /// Connects as cluster admin (the fixture's kubeconfig) and creates namespace `ns`.
    pub fn connect(api: &Apiserver, ns: &str) -> Kube {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let path = PathBuf::from(api.get("KUBECONFIG"));
        let client = rt.block_on(async {
            let kc = kube::config::Kubeconfig::read_from(&path).expect("read admin kubeconfig");
            let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .expect("admin kubeconfig");
            kube::Client::try_from(cfg).expect("client")
        });
        let k = Kube {
            rt,
            client,
            ns: ns.to_string(),
        };
        k.ensure_namespace(ns);
        k
    }

    /// The same client, for another namespace.
    pub fn in_namespace(&self, ns: &str) -> KubeNs<'_> {
        KubeNs {
            k: self,
            ns: ns.to_string(),
        }
    }

    pub fn ns(&self) -> KubeNs<'_> {
        self.in_namespace(&self.ns.clone())
    }

    /// Creates the Node and writes its InternalIPs through the status subresource.
    pub fn create_node(&self, name: &str, internal_ips: &[&str]) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": name}
        }))
        .expect("node");
        self.rt
            .block_on(nodes.create(&PostParams::default(), &node))
            .unwrap_or_else(|e| panic!("create node {name}: {e}"));
        let addresses: Vec<Value> = internal_ips
            .iter()
            .map(|ip| json!({"type": "InternalIP", "address": ip}))
            .collect();
        self.rt
            .block_on(nodes.patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"addresses": addresses}})),
            ))
            .unwrap_or_else(|e| panic!("node {name} status: {e}"));
    }

    /// The `events.k8s.io/v1` Events in namespace `default` (where kube-proxy posts those about
    /// its Node), as JSON.
    pub fn node_events(&self) -> Vec<Value> {
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(self.client.clone(), "default");
        let list = self
            .rt
            .block_on(events.list(&ListParams::default()))
            .unwrap_or_else(|e| panic!("list events: {e}"));
        list.items
            .into_iter()
            .map(|e| serde_json::to_value(e).expect("event json"))
            .collect()
    }

    pub fn ensure_namespace(&self, ns: &str) {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let nsobj: Namespace = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}
        }))
        .expect("namespace");
        match self
            .rt
            .block_on(namespaces.create(&PostParams::default(), &nsobj))
        {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("create namespace {ns}: {e}"),
        }
    }
}

/// The client bound to one namespace.
pub struct KubeNs<'a> {
    k: &'a Kube,
    ns: String,
}

impl KubeNs<'_> {
    fn services(&self) -> Api<Service> {
        Api::namespaced(self.k.client.clone(), &self.ns)
    }
    fn slices(&self) -> Api<EndpointSlice> {
        Api::namespaced(self.k.client.clone(), &self.ns)
    }
    fn block<T>(&self, f: impl std::future::Future<Output = T>) -> T {
        self.k.rt.block_on(f)
    }

    pub fn create_service(&self, svc: &Svc) -> Service {
        let obj: Service = serde_json::from_value(svc.0.clone()).expect("service json");
        self.block(self.services().create(&PostParams::default(), &obj))
            .unwrap_or_else(|e| panic!("create service {}: {e}\n{}", svc.name(), svc.0))
    }

    /// Creates a Service, or says why the API refused it.
    pub fn try_create_service(&self, svc: &Svc) -> Result<Service, String> {
        let obj: Service = serde_json::from_value(svc.0.clone()).map_err(|e| e.to_string())?;
        self.block(self.services().create(&PostParams::default(), &obj))
            .map_err(|e| e.to_string())
    }

    /// Creates a slice, or says why the API refused it.
    pub fn try_create_slice(&self, slice: &Slice) -> Result<(), String> {
        let obj: EndpointSlice =
            serde_json::from_value(slice.0.clone()).map_err(|e| e.to_string())?;
        self.block(self.slices().create(&PostParams::default(), &obj))
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    /// Writes `status.loadBalancer.ingress`, or says why the API refused it.
    pub fn try_set_lb_ingress(&self, name: &str, ips: &[&str]) -> Result<(), String> {
        let ingress: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
        self.block(self.services().patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": ingress}}})),
        ))
        .map(|_| ())
        .map_err(|e| e.to_string())
    }

    /// Creates many Services and slices with `parallel` requests in flight (one by one,
    /// thousands of objects take minutes); an object that already exists is left as it is
    /// (409), so a second call reuses the first's. Panics on any other refusal.
    pub fn create_many(&self, svcs: &[Svc], slices: &[Slice], parallel: usize) {
        use futures_util::stream::{self, StreamExt};
        let services = self.services();
        let slice_api = self.slices();
        let ok_or_exists = |what: String, r: Result<(), kube::Error>| match r {
            Ok(()) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("create {what}: {e}"),
        };
        self.block(async {
            let svc_objs: Vec<(String, Service)> = svcs
                .iter()
                .map(|s| {
                    (
                        s.name(),
                        serde_json::from_value(s.0.clone()).expect("service json"),
                    )
                })
                .collect();
            let results: Vec<(String, Result<(), kube::Error>)> = stream::iter(svc_objs)
                .map(|(name, obj)| {
                    let api = services.clone();
                    async move {
                        let r = api.create(&PostParams::default(), &obj).await.map(|_| ());
                        (format!("service {name}"), r)
                    }
                })
                .buffer_unordered(parallel)
                .collect()
                .await;
            for (what, r) in results {
                ok_or_exists(what, r);
            }
            let slice_objs: Vec<(String, EndpointSlice)> = slices
                .iter()
                .map(|s| {
                    (
                        s.name(),
                        serde_json::from_value(s.0.clone()).expect("slice json"),
                    )
                })
                .collect();
            let results: Vec<(String, Result<(), kube::Error>)> = stream::iter(slice_objs)
                .map(|(name, obj)| {
                    let api = slice_api.clone();
                    async move {
                        let r = api.create(&PostParams::default(), &obj).await.map(|_| ());
                        (format!("slice {name}"), r)
                    }
                })
                .buffer_unordered(parallel)
                .collect()
                .await;
            for (what, r) in results {
                ok_or_exists(what, r);
            }
        });
    }

    pub fn create_slice(&self, slice: &Slice) {
        let obj: EndpointSlice = serde_json::from_value(slice.0.clone()).expect("slice json");
        self.block(self.slices().create(&PostParams::default(), &obj))
            .unwrap_or_else(|e| panic!("create slice {}: {e}\n{}", slice.name(), slice.0));
    }

    /// A JSON merge patch of a Service (lists such as `spec.ports` are replaced whole).
    pub fn patch_service(&self, name: &str, patch: Value) {
        self.block(
            self.services()
                .patch(name, &PatchParams::default(), &Patch::Merge(patch)),
        )
        .unwrap_or_else(|e| panic!("patch service {name}: {e}"));
    }

    /// A JSON merge patch of a slice (`endpoints` and `ports` are replaced whole).
    pub fn patch_slice(&self, name: &str, patch: Value) {
        self.block(
            self.slices()
                .patch(name, &PatchParams::default(), &Patch::Merge(patch)),
        )
        .unwrap_or_else(|e| panic!("patch slice {name}: {e}"));
    }

    /// Writes `status.loadBalancer.ingress` (what a cloud controller would do).
    pub fn set_lb_ingress(&self, name: &str, ips: &[&str]) {
        let ingress: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
        self.set_lb_ingress_json(name, ingress);
    }

    /// The same with the entries as JSON (for `ipMode`).
    pub fn set_lb_ingress_json(&self, name: &str, ingress: Vec<Value>) {
        self.block(self.services().patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"loadBalancer": {"ingress": ingress}}})),
        ))
        .unwrap_or_else(|e| panic!("service {name} status: {e}"));
    }

    pub fn delete_service(&self, name: &str) {
        self.block(self.services().delete(name, &DeleteParams::default()))
            .unwrap_or_else(|e| panic!("delete service {name}: {e}"));
    }

    pub fn delete_slice(&self, name: &str) {
        self.block(self.slices().delete(name, &DeleteParams::default()))
            .unwrap_or_else(|e| panic!("delete slice {name}: {e}"));
    }

    /// Deletes every Service and EndpointSlice of the namespace; true if there was any.
    pub fn delete_all(&self) -> bool {
        let lp = ListParams::default();
        let svcs = self
            .block(self.services().list(&lp))
            .unwrap_or_else(|e| panic!("list services: {e}"));
        let slices = self
            .block(self.slices().list(&lp))
            .unwrap_or_else(|e| panic!("list slices: {e}"));
        let any = !svcs.items.is_empty() || !slices.items.is_empty();
        for s in svcs.items {
            self.delete_service(s.metadata.name.as_deref().expect("name"));
        }
        for s in slices.items {
            self.delete_slice(s.metadata.name.as_deref().expect("name"));
        }
        any
    }
}
