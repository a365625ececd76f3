//! The run context and one test environment: a server (ours or Go) plus one agent (upstream's
//! `proxy-agent` or our `konnectivity-agent`), or several servers behind one agent.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use kube_traffic::tls::DevPki;

use crate::opts::Opts;
use crate::pattern::splitmix;
use crate::procs::{cpu_secs, self_cpu_secs, Ports, Proc};

/// Whose implementation: ours (Rust) or upstream's (Go). Of a server or of an agent.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Impl {
    Ours,
    Go,
}

impl Impl {
    pub fn name(self) -> &'static str {
        match self {
            Impl::Ours => "ours",
            Impl::Go => "go",
        }
    }
}

/// What one workload run measures: a server behind which one agent runs. The server
/// comparison is the pairs with upstream's agent; the agent comparison adds our agent.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Pair {
    pub server: Impl,
    pub agent: Impl,
}

impl Pair {
    pub const fn new(server: Impl, agent: Impl) -> Pair {
        Pair { server, agent }
    }
    /// For logs and directory names: the server, with the agent when it is ours.
    pub fn label(self) -> String {
        match self.agent {
            Impl::Go => self.server.name().to_string(),
            Impl::Ours => format!("{}+our-agent", self.server.name()),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum FrontMode {
    Grpc,
    HttpConnect,
}

pub struct Ctx {
    pub opts: Opts,
    pub tmp: PathBuf,
    pub certs: DevPki,
    pub ports: Mutex<Ports>,
    pub far: SocketAddr,
    pub far_pid: u32,
    pub seeds: AtomicU64,
    pub go_server: PathBuf,
    /// Upstream's `proxy-agent`.
    pub go_agent: PathBuf,
    /// Our `konnectivity-agent` (`--agent-bin`, else beside `--server-bin`).
    pub our_agent: PathBuf,
    pub env_counter: AtomicU64,
}

impl Ctx {
    pub fn seed(&self) -> u64 {
        splitmix(self.seeds.fetch_add(1, Ordering::Relaxed))
    }
    pub fn port(&self) -> Result<u16> {
        self.ports.lock().unwrap().alloc()
    }
    pub fn agent_bin(&self, agent: Impl) -> &Path {
        match agent {
            Impl::Ours => &self.our_agent,
            Impl::Go => &self.go_agent,
        }
    }
}

/// One server + one agent. Drop kills the agent, then the server.
pub struct Env {
    pub agent: Proc,
    pub server: Proc,
    pub sock: PathBuf,
    #[allow(dead_code)]
    pub health_port: u16,
    pub agent_port: u16,
}

/// One running server (not yet with an agent).
pub struct Server {
    pub proc: Proc,
    pub sock: PathBuf,
    pub health_port: u16,
    pub agent_port: u16,
}

pub async fn http_get(port: u16, path: &str) -> Result<(u16, String)> {
    let fut = async {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .await?;
        let mut out = Vec::new();
        s.read_to_end(&mut out).await?;
        let text = String::from_utf8_lossy(&out).to_string();
        let code: u16 = text
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| anyhow!("bad HTTP response"))?;
        let body = text
            .split_once("\r\n\r\n")
            .map(|x| x.1)
            .unwrap_or("")
            .to_string();
        Ok::<_, anyhow::Error>((code, body))
    };
    tokio::time::timeout(Duration::from_secs(3), fut)
        .await
        .context("HTTP timeout")?
}

/// A fresh directory for one environment under the run's work directory.
pub fn env_dir(ctx: &Ctx, tag: &str, pair: Pair) -> Result<PathBuf> {
    let n = ctx.env_counter.fetch_add(1, Ordering::Relaxed);
    let dir = ctx.tmp.join(format!("{n:03}-{tag}-{}", pair.label()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Starts one server in `dir` (`--server-id`, `--server-count`) and waits for `/healthz` and
/// its socket; retries on a port clash.
pub async fn start_server(
    ctx: &Ctx,
    imp: Impl,
    mode: FrontMode,
    dir: &Path,
    server_id: &str,
    server_count: usize,
    extra: &[&str],
) -> Result<Server> {
    let sock = dir.join("konn.sock");
    let bin = match imp {
        Impl::Ours => ctx.opts.server_bin.clone(),
        Impl::Go => ctx.go_server.clone(),
    };
    for attempt in 1..=3 {
        let (ap, hp, mp) = (ctx.port()?, ctx.port()?, ctx.port()?);
        let mut args = vec![
            format!(
                "--mode={}",
                if mode == FrontMode::Grpc {
                    "grpc"
                } else {
                    "http-connect"
                }
            ),
            format!("--uds-name={}", sock.display()),
            "--server-port=0".into(),
            format!("--cluster-cert={}", ctx.certs.server_cert.display()),
            format!("--cluster-key={}", ctx.certs.server_key.display()),
            format!("--cluster-ca-cert={}", ctx.certs.ca_cert.display()),
            format!("--agent-port={ap}"),
            format!("--health-port={hp}"),
            format!("--admin-port={mp}"),
            "--agent-bind-address=127.0.0.1".into(),
            "--health-bind-address=127.0.0.1".into(),
            "--admin-bind-address=127.0.0.1".into(),
            format!("--server-id={server_id}"),
            format!("--server-count={server_count}"),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        // Under a profiler (`konn_bench drive --wrap`) ours starts many times slower.
        let wrap = &ctx.opts.server_wrap;
        let (bin, args, up_within) = match (imp, wrap.split_first()) {
            (Impl::Ours, Some((tool, tool_args))) => {
                let mut a = tool_args.to_vec();
                a.push(bin.display().to_string());
                a.extend(args);
                (PathBuf::from(tool), a, Duration::from_secs(300))
            }
            _ => (bin.clone(), args, Duration::from_secs(20)),
        };
        let log = dir.join(format!("server-{server_id}-{attempt}.log"));
        let mut p = Proc::spawn(&format!("server-{}", imp.name()), &bin, &args, &log)?;
        let deadline = Instant::now() + up_within;
        let mut last = String::new();
        let up = loop {
            if let Some(st) = p.exited() {
                last = format!("exited: {st}");
                break false;
            }
            match http_get(hp, "/healthz").await {
                Ok((200, _)) if sock.exists() => break true,
                Ok((c, b)) => last = format!("healthz {c} {b:?}, sock exists: {}", sock.exists()),
                Err(e) => last = format!("healthz: {e:#}"),
            }
            if Instant::now() > deadline {
                break false;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        if up {
            return Ok(Server {
                proc: p,
                sock,
                health_port: hp,
                agent_port: ap,
            });
        }
        if attempt < 3 && p.log_contains("address already in use") {
            eprintln!(
                "  (port clash, retrying {} server with new ports)",
                imp.name()
            );
            continue;
        }
        bail!(
            "{} server did not come up: {last}\n--- {} log tail ---\n{}",
            imp.name(),
            p.name,
            p.tail(30)
        );
    }
    bail!("server did not start")
}

/// One agent (ours or upstream's, the same flags) dialing `127.0.0.1:server_port`; returns it
/// with its health port (`/metrics`).
pub fn spawn_agent(
    ctx: &Ctx,
    agent: Impl,
    dir: &Path,
    server_port: u16,
    extra: &[&str],
) -> Result<(Proc, u16)> {
    let (ahp, aap) = (ctx.port()?, ctx.port()?);
    let id = dir.file_name().unwrap_or_default().to_string_lossy();
    let mut agent_args = vec![
        format!("--ca-cert={}", ctx.certs.ca_cert.display()),
        format!("--agent-cert={}", ctx.certs.agent_cert.display()),
        format!("--agent-key={}", ctx.certs.agent_key.display()),
        "--proxy-server-host=127.0.0.1".into(),
        format!("--proxy-server-port={server_port}"),
        format!("--agent-id=bench-agent-{id}"),
        "--agent-identifiers=host=localhost&ipv4=127.0.0.1".into(),
        "--health-server-host=127.0.0.1".into(),
        format!("--health-server-port={ahp}"),
        "--admin-bind-address=127.0.0.1".into(),
        format!("--admin-server-port={aap}"),
    ];
    agent_args.extend(extra.iter().map(|s| s.to_string()));
    let p = Proc::spawn(
        &format!("agent-{}", agent.name()),
        ctx.agent_bin(agent),
        &agent_args,
        &dir.join("agent.log"),
    )?;
    Ok((p, ahp))
}

pub async fn start_env(
    ctx: &Ctx,
    pair: Pair,
    mode: FrontMode,
    tag: &str,
    extra: &[&str],
) -> Result<Env> {
    let dir = env_dir(ctx, tag, pair)?;
    let imp = pair.server;
    let server = start_server(
        ctx,
        imp,
        mode,
        &dir,
        &format!("bench-{}", imp.name()),
        1,
        extra,
    )
    .await?;
    let Server {
        proc: mut server,
        sock,
        health_port: hp,
        agent_port: ap,
    } = server;
    let (mut agent, _) = spawn_agent(ctx, pair.agent, &dir, ap, &[])?;
    let ready_within = if ctx.opts.server_wrap.is_empty() {
        20
    } else {
        300
    };
    let deadline = Instant::now() + Duration::from_secs(ready_within);
    loop {
        if let Some(st) = agent.exited() {
            bail!("agent exited: {st}\n{}", agent.tail(30));
        }
        if let Some(st) = server.exited() {
            bail!("server exited: {st}\n{}", server.tail(30));
        }
        if let Ok((200, body)) = http_get(hp, "/readyz").await {
            if body.trim() == "ok" {
                break;
            }
        }
        if Instant::now() > deadline {
            bail!(
                "{} server not ready with the {} agent within {ready_within} s\n--- server ---\n{}\n--- agent ---\n{}",
                imp.name(),
                pair.agent.name(),
                server.tail(20),
                agent.tail(20)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(Env {
        agent,
        server,
        sock,
        health_port: hp,
        agent_port: ap,
    })
}

/// A TCP round-robin proxy on 127.0.0.1 in front of several servers' agent ports (what a
/// load balancer is to an HA deployment: the agent dials one address and reaches each server
/// by retrying). Connection `i` goes to backend `i % n`. Dropping it stops accepting and ends
/// every proxied connection.
pub struct RoundRobin {
    pub port: u16,
    task: JoinHandle<()>,
}

impl Drop for RoundRobin {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub async fn round_robin(ctx: &Ctx, backends: Vec<u16>) -> Result<RoundRobin> {
    let port = ctx.port()?;
    let listener = TcpListener::bind(("127.0.0.1", port))
        .await
        .with_context(|| format!("bind the round-robin proxy on 127.0.0.1:{port}"))?;
    let task = tokio::spawn(async move {
        // The proxied connections are this task's children: aborting it ends them all.
        let mut conns = tokio::task::JoinSet::new();
        let mut next = 0usize;
        loop {
            tokio::select! {
                acc = listener.accept() => {
                    let Ok((mut down, _)) = acc else { continue };
                    let backend = backends[next % backends.len()];
                    next += 1;
                    conns.spawn(async move {
                        if let Ok(mut up) = TcpStream::connect(("127.0.0.1", backend)).await {
                            let _ = down.set_nodelay(true);
                            let _ = up.set_nodelay(true);
                            let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                        }
                    });
                }
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
            }
        }
    });
    Ok(RoundRobin { port, task })
}

/// A gauge or counter from a Prometheus text page (the sum over its label sets).
pub fn prom_value(text: &str, name: &str) -> Option<f64> {
    let mut found = None;
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with(' ') || rest.starts_with('{')) {
            continue;
        }
        let v: f64 = rest.rsplit(' ').next()?.trim().parse().ok()?;
        found = Some(found.unwrap_or(0.0) + v);
    }
    found
}

pub struct CpuSnap {
    pub client: f64,
    pub server: f64,
    pub agent: f64,
    pub sink: f64,
}

pub fn snap(ctx: &Ctx, env: Option<&Env>) -> CpuSnap {
    CpuSnap {
        client: self_cpu_secs(),
        server: env.map(|e| cpu_secs(e.server.pid())).unwrap_or(0.0),
        agent: env.map(|e| cpu_secs(e.agent.pid())).unwrap_or(0.0),
        sink: cpu_secs(ctx.far_pid),
    }
}
