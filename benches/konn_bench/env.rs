//! The run context and one test environment: a server (ours or Go) plus the upstream agent.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use konnectivity_server::tls::DevPki;

use crate::opts::Opts;
use crate::pattern::splitmix;
use crate::procs::{cpu_secs, self_cpu_secs, Ports, Proc};

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
    pub agent_bin: PathBuf,
    pub env_counter: AtomicU64,
}

impl Ctx {
    pub fn seed(&self) -> u64 {
        splitmix(self.seeds.fetch_add(1, Ordering::Relaxed))
    }
    pub fn port(&self) -> Result<u16> {
        self.ports.lock().unwrap().alloc()
    }
}

/// One server + one upstream agent. Drop kills the agent, then the server.
pub struct Env {
    pub agent: Proc,
    pub server: Proc,
    pub sock: PathBuf,
    #[allow(dead_code)]
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

pub async fn start_env(
    ctx: &Ctx,
    imp: Impl,
    mode: FrontMode,
    tag: &str,
    extra: &[&str],
) -> Result<Env> {
    let n = ctx.env_counter.fetch_add(1, Ordering::Relaxed);
    let dir = ctx.tmp.join(format!("{n:03}-{tag}-{}", imp.name()));
    std::fs::create_dir_all(&dir)?;
    let sock = dir.join("konn.sock");
    let bin = match imp {
        Impl::Ours => ctx.opts.server_bin.clone(),
        Impl::Go => ctx.go_server.clone(),
    };
    let mut server = None;
    let mut ports = (0, 0, 0);
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
            format!("--server-id=bench-{}", imp.name()),
            "--server-count=1".into(),
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
        let mut p = Proc::spawn(
            &format!("server-{}", imp.name()),
            &bin,
            &args,
            &dir.join(format!("server-{attempt}.log")),
        )?;
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
            server = Some(p);
            ports = (ap, hp, mp);
            break;
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
    let server = server.ok_or_else(|| anyhow!("server did not start"))?;
    let (ap, hp, _) = ports;
    let (ahp, aap) = (ctx.port()?, ctx.port()?);
    let agent_args = vec![
        format!("--ca-cert={}", ctx.certs.ca_cert.display()),
        format!("--agent-cert={}", ctx.certs.agent_cert.display()),
        format!("--agent-key={}", ctx.certs.agent_key.display()),
        "--proxy-server-host=127.0.0.1".into(),
        format!("--proxy-server-port={ap}"),
        format!("--agent-id=bench-agent-{n}"),
        "--agent-identifiers=host=localhost&ipv4=127.0.0.1".into(),
        "--health-server-host=127.0.0.1".into(),
        format!("--health-server-port={ahp}"),
        "--admin-bind-address=127.0.0.1".into(),
        format!("--admin-server-port={aap}"),
    ];
    let mut agent = Proc::spawn("agent", &ctx.agent_bin, &agent_args, &dir.join("agent.log"))?;
    let ready_within = if ctx.opts.server_wrap.is_empty() {
        20
    } else {
        300
    };
    let deadline = Instant::now() + Duration::from_secs(ready_within);
    let mut server = server;
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
                "{} server not ready with the agent within {ready_within} s\n--- server ---\n{}\n--- agent ---\n{}",
                imp.name(),
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
