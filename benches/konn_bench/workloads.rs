//! The workloads: bulk, short tunnels, idle tunnels, head-of-line, and the direct-TCP limit.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use bytes::{Bytes, BytesMut};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::env::{snap, start_env, CpuSnap, Ctx, FrontMode, Impl, Pair};
use crate::farend::{header, HEADER_LEN, HOLD_ACK, MODE_HOLD, MODE_STREAM, MODE_TRANSFER};
use crate::pattern::{splitmix, Pattern, UP_SEED_XOR};
use crate::procs::{cpu_secs, status_kib};
use crate::results::{percentile, Metrics};
use crate::tunnel::{dial, direct_dial, uds_channel, Style, Tunnel};
use crate::{GIB, KIB};

/// What one workload run produced. Any entry in `failures` fails the workload (and the run):
/// its metrics are kept in results.json for diagnosis but never enter the tables.
#[derive(Default)]
pub struct Outcome {
    pub metrics: Metrics,
    /// Metrics whose value is a lower bound (a percentile that landed on a timeout).
    pub censored: BTreeSet<String>,
    /// For metrics computed from many samples in one run (percentiles): how many.
    pub samples: BTreeMap<String, u64>,
    /// Informational only (e.g. tunnels the head-of-line effect blocked, which the
    /// throughput already counts at zero).
    pub notes: Vec<String>,
    pub failures: Vec<String>,
}

impl Outcome {
    pub fn new() -> Self {
        Outcome::default()
    }
    pub fn set(&mut self, k: &str, v: f64) {
        self.metrics.insert(k.to_string(), v);
    }
    /// A lower bound: the true value is at least `v`.
    pub fn set_censored(&mut self, k: &str, v: f64) {
        self.set(k, v);
        self.censored.insert(k.to_string());
    }
}

/// The bulk transfer on one tunnel: `n` bytes down, then `n` bytes up; shared by bulk and limit.
pub async fn bulk_transfer(ctx: &Ctx, t: &mut Tunnel, n: u64, o: &mut Outcome) -> Result<()> {
    let seed = ctx.seed();
    let t0 = Instant::now();
    t.send(Bytes::copy_from_slice(&header(MODE_TRANSFER, seed, n, n)))
        .await?;
    t.read_verify(n, &mut Pattern::new(seed)).await?;
    let down = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    t.send_pattern(n, &mut Pattern::new(seed ^ UP_SEED_XOR))
        .await?;
    t.check_trailer().await?;
    let up = t1.elapsed().as_secs_f64();
    let mb = n as f64 / 1e6;
    o.set("down_mbps", mb / down);
    o.set("up_mbps", mb / up);
    o.set("mbps", 2.0 * mb / (down + up));
    Ok(())
}

pub fn cpu_split(o: &mut Outcome, a: &CpuSnap, b: &CpuSnap, gib: f64, with_server: bool) {
    if with_server {
        o.set("server_cpu_s_per_gib", (b.server - a.server) / gib);
        o.set("agent_cpu_s_per_gib", (b.agent - a.agent) / gib);
        o.set(
            "path_cpu_s_per_gib",
            (b.server - a.server + b.agent - a.agent) / gib,
        );
    }
    o.set("client_cpu_s_per_gib", (b.client - a.client) / gib);
    o.set("sink_cpu_s_per_gib", (b.sink - a.sink) / gib);
}

pub async fn w_bulk(ctx: &Ctx, pair: Pair) -> Result<Outcome> {
    let env = start_env(ctx, pair, FrontMode::Grpc, "bulk", &[]).await?;
    let n = ctx.opts.bulk_bytes;
    let mut o = Outcome::new();
    let a = snap(ctx, Some(&env));
    let mut t = dial(&Style::Single, &env.sock, ctx.far).await?;
    bulk_transfer(ctx, &mut t, n, &mut o).await?;
    t.close().await?;
    let b = snap(ctx, Some(&env));
    cpu_split(&mut o, &a, &b, 2.0 * n as f64 / GIB as f64, true);
    o.set(
        "peak_rss_mib",
        status_kib(env.server.pid(), "VmHWM") / 1024.0,
    );
    Ok(o)
}

pub async fn w_limit(ctx: &Ctx) -> Result<Outcome> {
    let n = ctx.opts.bulk_bytes;
    let mut o = Outcome::new();
    let a = snap(ctx, None);
    let mut t = direct_dial(ctx.far).await?;
    bulk_transfer(ctx, &mut t, n, &mut o).await?;
    t.close().await?;
    let b = snap(ctx, None);
    cpu_split(&mut o, &a, &b, 2.0 * n as f64 / GIB as f64, false);
    Ok(o)
}

/// One short tunnel's result: the dial latency in seconds (+inf if the dial timed out, None if
/// it failed: an error is no latency sample) and the failure, if any. A tunnel whose dial
/// succeeded but whose transfer or close failed keeps its latency.
pub struct ShortTry {
    pub dial_secs: Option<f64>,
    pub failure: Option<String>,
}

/// One short tunnel: dial, 1 KiB each way (checked), close; all within `limit`.
pub async fn short_one(
    style: &Style,
    sock: &Path,
    far: SocketAddr,
    seed: u64,
    limit: Duration,
) -> ShortTry {
    let t0 = Instant::now();
    let mut t = match tokio::time::timeout(limit, dial(style, sock, far)).await {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => {
            return ShortTry {
                dial_secs: None,
                failure: Some(format!("{e:#}")),
            }
        }
        Err(_) => {
            return ShortTry {
                dial_secs: Some(f64::INFINITY),
                failure: Some(format!("dial timed out ({})", fmt_limit(limit))),
            }
        }
    };
    let lat = t0.elapsed();
    let rest = async {
        let n = KIB;
        let mut req = BytesMut::with_capacity(HEADER_LEN + n as usize);
        req.extend_from_slice(&header(MODE_TRANSFER, seed, n, n));
        let mut up = vec![0u8; n as usize];
        Pattern::new(seed ^ UP_SEED_XOR).fill(&mut up);
        req.extend_from_slice(&up);
        t.send(req.freeze()).await?;
        t.read_verify(n, &mut Pattern::new(seed)).await?;
        t.check_trailer().await?;
        t.close().await
    };
    let failure = match tokio::time::timeout(limit.saturating_sub(lat), rest).await {
        Ok(Ok(())) => None,
        Ok(Err(e)) => Some(format!("{e:#}")),
        Err(_) => Some(format!(
            "transfer or close timed out (tunnel limit {})",
            fmt_limit(limit)
        )),
    };
    ShortTry {
        dial_secs: Some(lat.as_secs_f64()),
        failure,
    }
}

fn fmt_limit(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

pub async fn w_short(ctx: &Ctx, pair: Pair, which: &str) -> Result<Outcome> {
    let mode = if which == "connect" {
        FrontMode::HttpConnect
    } else {
        FrontMode::Grpc
    };
    let env = start_env(ctx, pair, mode, &format!("short-{which}"), &[]).await?;
    let style = match which {
        "single" => Style::Single,
        "reusable" => Style::Reusable(uds_channel(&env.sock).await?),
        _ => Style::Connect,
    };
    let dur = Duration::from_secs_f64(ctx.opts.short_secs);
    let limit = Duration::from_secs_f64(ctx.opts.short_timeout_secs);
    let a = snap(ctx, Some(&env));
    let t0 = Instant::now();
    let stop = t0 + dur;
    let mut set = JoinSet::new();
    let base_seed = ctx.seed();
    for w in 0..ctx.opts.short_clients {
        let style = style.clone();
        let sock = env.sock.clone();
        let far = ctx.far;
        set.spawn(async move {
            let mut tries = Vec::new();
            let mut i = 0u64;
            while Instant::now() < stop {
                let seed = splitmix(base_seed ^ ((w as u64) << 40) ^ i);
                i += 1;
                tries.push(short_one(&style, &sock, far, seed, limit).await);
            }
            tries
        });
    }
    let mut tries = Vec::new();
    let joined = tokio::time::timeout(dur + limit + Duration::from_secs(30), async {
        while let Some(r) = set.join_next().await {
            tries.extend(r?);
        }
        Ok::<_, anyhow::Error>(())
    })
    .await;
    let elapsed = t0.elapsed().as_secs_f64();
    let b = snap(ctx, Some(&env));
    joined.context("short-tunnel clients did not finish")??;
    // Every answered or timed-out dial is a latency sample; a timed-out one counts as +inf, so
    // a percentile that lands on one is reported as ">= the timeout" (censored), never as a
    // fast dial.
    let mut lats: Vec<f64> = tries.iter().filter_map(|t| t.dial_secs).collect();
    lats.sort_by(f64::total_cmp);
    let errs: Vec<String> = tries.iter().filter_map(|t| t.failure.clone()).collect();
    let ok = (tries.len() - errs.len()) as f64;
    let mut o = Outcome::new();
    o.set("tunnels_per_s", ok / elapsed);
    for (key, q) in [("dial_p50_ms", 0.50), ("dial_p99_ms", 0.99)] {
        let p = percentile(&lats, q);
        if p.is_infinite() {
            o.set_censored(key, limit.as_secs_f64() * 1e3);
        } else {
            o.set(key, p * 1e3);
        }
        o.samples.insert(key.to_string(), lats.len() as u64);
    }
    o.set("server_cpu_us_per_tunnel", (b.server - a.server) / ok * 1e6);
    o.set("agent_cpu_us_per_tunnel", (b.agent - a.agent) / ok * 1e6);
    o.set(
        "path_cpu_us_per_tunnel",
        (b.server - a.server + b.agent - a.agent) / ok * 1e6,
    );
    o.set("errors", errs.len() as f64);
    o.samples.insert("errors".into(), tries.len() as u64);
    if let Some(e) = summarize_errs(&format!("of {} short tunnels failed", tries.len()), &errs) {
        o.failures.push(e);
    }
    drop(style);
    Ok(o)
}

pub async fn open_idle(
    style: &Style,
    env_sock: &Path,
    far: SocketAddr,
    n: usize,
    seed0: u64,
) -> Result<Vec<Tunnel>> {
    let sem = Arc::new(Semaphore::new(64));
    let mut set = JoinSet::new();
    for i in 0..n {
        let sem = sem.clone();
        let sock = env_sock.to_path_buf();
        let style = style.clone();
        set.spawn(async move {
            let _permit = sem.acquire_owned().await?;
            let fut = async {
                let mut t = dial(&style, &sock, far).await?;
                t.send(Bytes::copy_from_slice(&header(
                    MODE_HOLD,
                    seed0 ^ i as u64,
                    0,
                    0,
                )))
                .await?;
                let ack = t.read_exact_vec(1).await?;
                if ack[0] != HOLD_ACK {
                    bail!("DATA MISMATCH: bad hold ack {:#x}", ack[0]);
                }
                Ok::<_, anyhow::Error>(t)
            };
            tokio::time::timeout(Duration::from_secs(30), fut)
                .await
                .context("idle tunnel open timed out (30 s)")?
        });
    }
    let mut out = Vec::with_capacity(n);
    while let Some(r) = set.join_next().await {
        out.push(r??);
    }
    Ok(out)
}

/// Closes every tunnel (64 at a time, each within `each`); returns the failures as
/// (errors, timeouts).
pub async fn close_all(tunnels: Vec<Tunnel>, each: Duration) -> (Vec<String>, Vec<String>) {
    let sem = Arc::new(Semaphore::new(64));
    let mut set = JoinSet::new();
    for t in tunnels {
        let sem = sem.clone();
        set.spawn(async move {
            let _permit = sem.acquire_owned().await;
            tokio::time::timeout(each, t.close()).await
        });
    }
    let (mut errs, mut timeouts) = (Vec::new(), Vec::new());
    while let Some(r) = set.join_next().await {
        match r {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => errs.push(format!("{e:#}")),
            Ok(Err(_)) => timeouts.push(format!("close timed out ({} s)", each.as_secs())),
            Err(e) => errs.push(e.to_string()),
        }
    }
    (errs, timeouts)
}

pub fn summarize_errs(what: &str, errs: &[String]) -> Option<String> {
    if errs.is_empty() {
        return None;
    }
    let mut u = errs.to_vec();
    u.sort();
    u.dedup();
    Some(format!(
        "{} {what}: {}",
        errs.len(),
        u.into_iter().take(2).collect::<Vec<_>>().join(" | ")
    ))
}

/// `n` idle tunnels held open: single-use gRPC ones (`Style::Single`) or HTTP-CONNECT ones
/// (`Style::Connect`, the server in `--mode=http-connect`).
pub async fn w_idle(ctx: &Ctx, pair: Pair, n: usize, style: Style) -> Result<Outcome> {
    let (mode, name) = match style {
        Style::Connect => (FrontMode::HttpConnect, format!("connect-idle{n}")),
        _ => (FrontMode::Grpc, format!("idle{n}")),
    };
    let env = start_env(ctx, pair, mode, &name, &[]).await?;
    let pid = env.server.pid();
    // Start-up settles first (the same settle as the agent-idle workload): an agent may still
    // be finishing its start when it first connects (ours gives back its start-up code pages a
    // second later), and a baseline read during that would count the code the tunnels run
    // again as memory per tunnel.
    tokio::time::sleep(Duration::from_secs_f64(ctx.opts.idle_settle_secs)).await;
    // Warm-up: let lazily built state exist before the baseline.
    let warm = open_idle(&style, &env.sock, ctx.far, 10, ctx.seed()).await?;
    let (errs, timeouts) = close_all(warm, Duration::from_secs(10)).await;
    if let Some(e) = summarize_errs("warm-up closes failed", &[errs, timeouts].concat()) {
        bail!(e);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss0 = status_kib(pid, "VmRSS");
    let agent_pid = env.agent.pid();
    let agent_rss0 = status_kib(agent_pid, "VmRSS");
    let t0 = Instant::now();
    let tunnels = open_idle(&style, &env.sock, ctx.far, n, ctx.seed()).await?;
    let open_s = t0.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs_f64(ctx.opts.idle_settle_secs)).await;
    let c0 = cpu_secs(pid);
    let w0 = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(ctx.opts.idle_secs)).await;
    let c1 = cpu_secs(pid);
    let window = w0.elapsed().as_secs_f64();
    let rss1 = status_kib(pid, "VmRSS");
    let agent_rss1 = status_kib(agent_pid, "VmRSS");
    let mut o = Outcome::new();
    o.set("agent_rss_mib_idle", agent_rss0 / 1024.0);
    o.set(
        "agent_rss_kib_per_tunnel",
        (agent_rss1 - agent_rss0) / n as f64,
    );
    o.set("agent_threads", status_kib(agent_pid, "Threads"));
    o.set("rss_kib_per_tunnel", (rss1 - rss0) / n as f64);
    o.set("rss_mib_total", rss1 / 1024.0);
    o.set("idle_cpu_ms_per_s", (c1 - c0) * 1e3 / window);
    o.set("open_per_s", n as f64 / open_s);
    let (errs, timeouts) = close_all(tunnels, Duration::from_secs(20)).await;
    let what = format!("of {n} idle-tunnel closes failed");
    o.failures
        .extend(summarize_errs(&what, &[errs, timeouts].concat()));
    Ok(o)
}

/// One head-of-line phase: `k` streaming tunnels read (and check) data for a window.
pub struct HolPhase {
    /// MB/s over all `k` tunnels; a tunnel that never got going counts with 0 bytes.
    pub mbps: f64,
    /// Dials not answered within the window and closes that timed out.
    pub blocked: Vec<String>,
    /// Closes that failed other than by timing out.
    pub close_errors: Vec<String>,
}

/// `k` streaming tunnels read (and check) for `secs`; the dials count inside the window.
/// A data mismatch or a tunnel that ends early is an error.
pub async fn hol_active(ctx: &Ctx, sock: &Path, k: usize, secs: f64) -> Result<HolPhase> {
    let start = Instant::now();
    let end = tokio::time::Instant::from_std(start + Duration::from_secs_f64(secs));
    let mut set = JoinSet::new();
    for _ in 0..k {
        let sock = sock.to_path_buf();
        let far = ctx.far;
        let seed = ctx.seed();
        set.spawn(async move {
            let mut bytes = 0u64;
            let t = tokio::time::timeout_at(end, async {
                let mut t = dial(&Style::Single, &sock, far).await?;
                t.send(Bytes::copy_from_slice(&header(MODE_STREAM, seed, 0, 0)))
                    .await?;
                Ok::<_, anyhow::Error>(t)
            })
            .await;
            let mut t = match t {
                Err(_) => {
                    let why = "dial not answered within the window".to_string();
                    return Ok((0u64, Some(why), None));
                }
                Ok(r) => r?,
            };
            let mut p = Pattern::new(seed);
            loop {
                match tokio::time::timeout_at(end, t.recv()).await {
                    Err(_) => break,
                    Ok(r) => {
                        let b = r?.ok_or_else(|| anyhow!("active tunnel ended early"))?;
                        p.check(&b)
                            .map_err(|off| anyhow!("DATA MISMATCH at offset {off} of a stream"))?;
                        bytes += b.len() as u64;
                    }
                }
            }
            Ok::<_, anyhow::Error>((bytes, None, Some(t)))
        });
    }
    let mut total = 0u64;
    let mut blocked: Vec<String> = Vec::new();
    let mut tunnels = Vec::new();
    let joined = tokio::time::timeout(Duration::from_secs_f64(secs + 30.0), async {
        while let Some(r) = set.join_next().await {
            let (b, why, t) = r??;
            total += b;
            blocked.extend(why);
            tunnels.extend(t);
        }
        Ok::<_, anyhow::Error>(())
    })
    .await;
    let elapsed = start.elapsed().as_secs_f64().max(secs);
    joined.context("active tunnels did not finish")??;
    let (close_errors, timeouts) = close_all(tunnels, Duration::from_secs(3)).await;
    blocked.extend(timeouts);
    Ok(HolPhase {
        mbps: total as f64 / 1e6 / elapsed,
        blocked,
        close_errors,
    })
}

pub async fn w_hol(ctx: &Ctx, pair: Pair) -> Result<Outcome> {
    let extra: &[&str] = match pair.server {
        Impl::Ours => &["--frontend-queue-stall-timeout=2s"],
        Impl::Go => &[],
    };
    let env = start_env(ctx, pair, FrontMode::Grpc, "hol", extra).await?;
    let k = ctx.opts.hol_active;
    let secs = ctx.opts.hol_secs;
    let mut o = Outcome::new();
    // Without a stalled tunnel every tunnel must dial, stream and close in time.
    let alone = hol_active(ctx, &env.sock, k, secs).await?;
    let what = format!("of {k} active tunnels failed (no stalled tunnel)");
    o.failures.extend(summarize_errs(
        &what,
        &[alone.blocked, alone.close_errors].concat(),
    ));
    // The stalled tunnel: asks for an endless stream and never reads.
    let mut stalled = tokio::time::timeout(
        Duration::from_secs(10),
        dial(&Style::Single, &env.sock, ctx.far),
    )
    .await
    .context("stalled tunnel dial timed out")??;
    stalled
        .send(Bytes::copy_from_slice(&header(
            MODE_STREAM,
            ctx.seed(),
            0,
            0,
        )))
        .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // With it, a tunnel the stall blocks (dial unanswered, close timed out) is the effect this
    // workload measures: it moved 0 bytes, which the throughput and share already count, and
    // it is reported as its own metric. Any other close failure fails the workload.
    let with = hol_active(ctx, &env.sock, k, secs).await?;
    let what = format!("of {k} active-tunnel closes failed (with a stalled tunnel)");
    o.failures.extend(summarize_errs(&what, &with.close_errors));
    let what = format!("of {k} active tunnels blocked by the stalled tunnel");
    o.notes.extend(summarize_errs(&what, &with.blocked));
    drop(stalled);
    o.set("active_mbps_alone", alone.mbps);
    o.set("active_mbps_with_stalled", with.mbps);
    o.set("blocked_with_stalled", with.blocked.len() as f64);
    o.set(
        "share_pct",
        if alone.mbps > 0.0 {
            with.mbps / alone.mbps * 100.0
        } else {
            f64::NAN
        },
    );
    Ok(o)
}
