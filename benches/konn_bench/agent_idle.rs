//! The `agent-idle-K` workload: one agent connected to K servers of one implementation, idle,
//! nothing else running; its resident memory and CPU.
//!
//! K = 1: the agent dials the server's agent port. K = 3: three servers (`--server-count=3`,
//! distinct `--server-id`s) behind a TCP round-robin proxy in this process (an HA
//! deployment's load balancer): the agent dials the one address, learns the count from the
//! server and connects again until it holds a connection to each server id, as upstream's
//! agent does. Both agents get `--sync-interval=100ms --sync-interval-cap=1s` here (as the
//! interop harness's HA scenario), so they find the servers quickly; nothing else differs
//! from the other workloads' agent flags.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use crate::env::{
    env_dir, http_get, prom_value, round_robin, spawn_agent, start_server, Ctx, FrontMode, Pair,
};
use crate::procs::{cpu_secs, status_kib};
use crate::tunnel::Style;
use crate::workloads::{short_one, Outcome};

const OPEN_SERVER_CONNECTIONS: &str = "konnectivity_network_proxy_agent_open_server_connections";

async fn agent_connections(health_port: u16) -> Option<f64> {
    match http_get(health_port, "/metrics").await {
        Ok((200, body)) => prom_value(&body, OPEN_SERVER_CONNECTIONS),
        _ => None,
    }
}

pub async fn w_agent_idle(ctx: &Ctx, pair: Pair, k: usize) -> Result<Outcome> {
    let dir = env_dir(ctx, &format!("agent-idle{k}"), pair)?;
    let mut servers = Vec::with_capacity(k);
    for i in 1..=k {
        let sdir = dir.join(format!("server-{i}"));
        std::fs::create_dir_all(&sdir)?;
        let id = format!("bench-{}-{i}", pair.server.name());
        servers.push(start_server(ctx, pair.server, FrontMode::Grpc, &sdir, &id, k, &[]).await?);
    }
    let lb = if k > 1 {
        Some(round_robin(ctx, servers.iter().map(|s| s.agent_port).collect()).await?)
    } else {
        None
    };
    let dial_port = lb.as_ref().map_or(servers[0].agent_port, |l| l.port);
    let (mut agent, health) = spawn_agent(
        ctx,
        pair.agent,
        &dir,
        dial_port,
        &["--sync-interval=100ms", "--sync-interval-cap=1s"],
    )?;
    // Connected: the agent reports K open server connections and every server is ready
    // (it has an agent, so each connection is to a distinct server).
    let t0 = Instant::now();
    let within = Duration::from_secs(30);
    loop {
        if let Some(st) = agent.exited() {
            bail!("agent exited: {st}\n{}", agent.tail(30));
        }
        let mut ready = 0;
        for s in servers.iter_mut() {
            if let Some(st) = s.proc.exited() {
                bail!("server exited: {st}\n{}", s.proc.tail(30));
            }
            if matches!(http_get(s.health_port, "/readyz").await, Ok((200, b)) if b.trim() == "ok")
            {
                ready += 1;
            }
        }
        let open = agent_connections(health).await;
        if ready == k && open == Some(k as f64) {
            break;
        }
        if t0.elapsed() > within {
            bail!(
                "{} agent not connected to {k} {} server(s) within {} s: {ready} ready, agent reports {open:?} open\n--- agent ---\n{}",
                pair.agent.name(),
                pair.server.name(),
                within.as_secs(),
                agent.tail(20)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let connect_s = t0.elapsed().as_secs_f64();
    let pid = agent.pid();
    tokio::time::sleep(Duration::from_secs_f64(ctx.opts.idle_settle_secs)).await;
    let c0 = cpu_secs(pid);
    let w0 = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(ctx.opts.idle_secs)).await;
    let c1 = cpu_secs(pid);
    let window = w0.elapsed().as_secs_f64();
    let rss = status_kib(pid, "VmRSS");
    let threads = status_kib(pid, "Threads");
    let mut o = Outcome::new();
    o.set("agent_rss_mib", rss / 1024.0);
    o.set("agent_idle_cpu_ms_per_s", (c1 - c0) * 1e3 / window);
    o.set("agent_threads", threads);
    o.set("agent_connect_s", connect_s);
    // Still connected to every server after the window, and each connection carries a
    // tunnel (1 KiB each way, checked) - after the readings, so they are of an idle agent.
    let open = agent_connections(health).await;
    if open != Some(k as f64) {
        o.failures.push(format!(
            "agent reports {open:?} open server connections after the idle window, want {k}"
        ));
    }
    let limit = Duration::from_secs_f64(ctx.opts.short_timeout_secs);
    for (i, s) in servers.iter().enumerate() {
        let t = short_one(&Style::Single, &s.sock, ctx.far, ctx.seed(), limit).await;
        if let Some(e) = t.failure {
            o.failures
                .push(format!("tunnel through server {} of {k}: {e}", i + 1));
        }
    }
    drop(agent);
    drop(lb);
    Ok(o)
}
