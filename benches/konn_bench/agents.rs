//! The `agents-N` workload: N connected, idle agents, each on its own mTLS HTTP/2 connection
//! with one `/AgentService/Connect` stream, all from this process (the Rust side of an agent:
//! tonic's AgentService client, `agentid` metadata, the stream read until it ends).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use kube_traffic::proto::agent_service_client::AgentServiceClient;
use kube_traffic::proto::Packet;

use crate::env::{start_env, Ctx, FrontMode, Pair};
use crate::procs::{cpu_secs, status_kib};
use crate::workloads::Outcome;

/// One connected agent: its connection, its (silent) outbound stream and the task reading the
/// server's stream. Dropping it ends the stream and closes the connection.
pub struct HeldAgent {
    _tx: mpsc::Sender<Packet>,
    reader: JoinHandle<()>,
    _channel: Channel,
}

impl Drop for HeldAgent {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

pub fn agent_tls(ctx: &Ctx) -> Result<ClientTlsConfig> {
    let ca = std::fs::read(&ctx.certs.ca_cert)?;
    let cert = std::fs::read(&ctx.certs.agent_cert)?;
    let key = std::fs::read(&ctx.certs.agent_key)?;
    Ok(ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .identity(Identity::from_pem(cert, key))
        .domain_name("localhost"))
}

/// Connects one agent: its own TCP + TLS + HTTP/2 connection, one Connect stream with
/// `agentid`, answered with the server's headers.
pub async fn connect_agent(port: u16, tls: ClientTlsConfig, id: String) -> Result<HeldAgent> {
    let channel = Endpoint::from_shared(format!("https://127.0.0.1:{port}"))?
        .tls_config(tls)?
        .connect()
        .await
        .context("agent mTLS HTTP/2 connect")?;
    let (tx, rx) = mpsc::channel::<Packet>(1);
    let mut req = tonic::Request::new(ReceiverStream::new(rx));
    req.metadata_mut().insert("agentid", id.parse()?);
    req.metadata_mut()
        .insert("agentidentifiers", "host=localhost".parse()?);
    let mut inbound = AgentServiceClient::new(channel.clone())
        .connect(req)
        .await
        .context("AgentService/Connect")?
        .into_inner();
    // The server sends nothing to an idle agent; read (and drop) whatever comes until the end.
    let reader = tokio::spawn(async move { while let Ok(Some(_)) = inbound.message().await {} });
    Ok(HeldAgent {
        _tx: tx,
        reader,
        _channel: channel,
    })
}

/// Connects `n` agents, `parallel` at a time, each within 30 s.
pub async fn connect_agents(
    ctx: &Ctx,
    port: u16,
    n: usize,
    tag: &str,
    parallel: usize,
) -> Result<Vec<HeldAgent>> {
    let tls = agent_tls(ctx)?;
    let sem = Arc::new(Semaphore::new(parallel));
    let mut set = JoinSet::new();
    for i in 0..n {
        let sem = sem.clone();
        let tls = tls.clone();
        let id = format!("bench-{tag}-{i}");
        set.spawn(async move {
            let _permit = sem.acquire_owned().await?;
            tokio::time::timeout(Duration::from_secs(30), connect_agent(port, tls, id))
                .await
                .map_err(|_| anyhow!("agent connect timed out (30 s)"))?
        });
    }
    let mut out = Vec::with_capacity(n);
    while let Some(r) = set.join_next().await {
        out.push(r??);
    }
    Ok(out)
}

pub async fn w_agents(ctx: &Ctx, pair: Pair, n: usize) -> Result<Outcome> {
    let env = start_env(ctx, pair, FrontMode::Grpc, &format!("agents{n}"), &[]).await?;
    let pid = env.server.pid();
    // Warm-up: lazily built state (TLS session caches, registry maps) exists before the baseline.
    let warm = connect_agents(ctx, env.agent_port, 10, "warm", 10).await?;
    drop(warm);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss0 = status_kib(pid, "VmRSS");
    let t0 = Instant::now();
    let agents = connect_agents(ctx, env.agent_port, n, "idle", 32).await?;
    let open_s = t0.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs_f64(ctx.opts.idle_settle_secs)).await;
    let c0 = cpu_secs(pid);
    let w0 = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(ctx.opts.idle_secs)).await;
    let c1 = cpu_secs(pid);
    let window = w0.elapsed().as_secs_f64();
    let rss1 = status_kib(pid, "VmRSS");
    let mut o = Outcome::new();
    let ended = agents.iter().filter(|a| a.reader.is_finished()).count();
    if ended > 0 {
        o.failures
            .push(format!("{ended} of {n} agent streams ended while idle"));
    }
    o.set("rss_kib_per_agent", (rss1 - rss0) / n as f64);
    o.set("rss_mib_total", rss1 / 1024.0);
    o.set(
        "idle_cpu_us_per_s_per_agent",
        (c1 - c0) * 1e6 / window / n as f64,
    );
    o.set("connect_per_s", n as f64 / open_s);
    drop(agents);
    Ok(o)
}
