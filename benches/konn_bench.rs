//! konn_bench: loads konnectivity-server and the upstream Go proxy-server side by side, the way
//! kube-apiserver does, and writes RESULTS.md (see benches/README.md).
//!
//! Built as a `[[bench]]` with `harness = false`; `benches/run` is the entry point. The same
//! binary is also the far end (`konn_bench farend`): a loopback TCP source/sink in its own
//! process, so its CPU is measured apart from the client's.
//!
//! Every byte that crosses a tunnel is compared with a deterministic stream (seeded splitmix64,
//! position-dependent): downloads by the client, uploads by the far end, which reports the
//! first mismatching offset in an 8-byte trailer. A server that loses, reorders or corrupts
//! data fails the workload.
//!
//! Processes: every child (servers, agents, far end) is spawned from the main thread with
//! PR_SET_PDEATHSIG=SIGKILL and is killed (SIGKILL + wait) when its guard drops, so nothing
//! outlives the tool, also on error or timeout. Every wait has a deadline.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write as _};
use std::net::{SocketAddr, TcpListener as StdTcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use bytes::{Bytes, BytesMut};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};
use tonic::Streaming;

use konnectivity_server::proto::packet::Payload;
use konnectivity_server::proto::proxy_service_client::ProxyServiceClient;
use konnectivity_server::proto::{CloseRequest, Data, DialRequest, Packet, PacketType};

/// `--client-window fixed`.
static FIXED_WINDOW: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * 1024 * 1024;

// ============================================================================ options

#[derive(Clone, Debug)]
struct Opts {
    quick: bool,
    rounds: usize,
    server_bin: PathBuf,
    upstream_dir: PathBuf,
    out: PathBuf,
    workloads: Vec<String>,
    bulk_bytes: u64,
    short_secs: f64,
    short_clients: usize,
    idle_counts: Vec<usize>,
    idle_settle_secs: f64,
    idle_secs: f64,
    hol_secs: f64,
    hol_active: usize,
    keep_tmp: bool,
    repo: PathBuf,
}

const ALL_WORKLOADS: &[&str] = &["bulk", "short", "idle", "hol", "limit"];

fn usage() -> &'static str {
    "usage: konn_bench --server-bin PATH --upstream-dir DIR [--out DIR] [--quick] [--rounds N]\n\
     \x20      [--workloads bulk,short,idle,hol,limit] [--bulk-mib N] [--short-secs S]\n\
     \x20      [--short-clients N] [--idle-counts 1000,10000] [--idle-secs S] [--hol-secs S]\n\
     \x20      [--client-window adaptive|fixed] [--keep-tmp] [--repo DIR]\n\
     \x20  konn_bench farend   (internal: the far-end source/sink process)"
}

fn parse_opts(args: &[String]) -> Result<Opts> {
    let quick = args.iter().any(|a| a == "--quick");
    let mut o = Opts {
        quick,
        rounds: if quick { 1 } else { 5 },
        server_bin: PathBuf::new(),
        upstream_dir: PathBuf::new(),
        out: PathBuf::from("."),
        workloads: ALL_WORKLOADS.iter().map(|s| s.to_string()).collect(),
        bulk_bytes: if quick { 32 * MIB } else { GIB },
        short_secs: if quick { 2.0 } else { 10.0 },
        short_clients: 64,
        idle_counts: if quick { vec![200] } else { vec![1000, 10000] },
        idle_settle_secs: if quick { 1.0 } else { 2.0 },
        idle_secs: if quick { 2.0 } else { 5.0 },
        hol_secs: if quick { 3.0 } else { 10.0 },
        hol_active: 10,
        keep_tmp: false,
        repo: std::env::current_dir()?,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let (key, inline) = match a.split_once('=') {
            Some((k, v)) if k.starts_with("--") => (k.to_string(), Some(v.to_string())),
            _ => (a.clone(), None),
        };
        let mut val = || -> Result<String> {
            match &inline {
                Some(v) => Ok(v.clone()),
                None => it
                    .next()
                    .cloned()
                    .ok_or_else(|| anyhow!("{key} needs a value")),
            }
        };
        match key.as_str() {
            "--quick" | "--bench" => {}
            "--keep-tmp" => o.keep_tmp = true,
            "--rounds" => o.rounds = val()?.parse()?,
            "--server-bin" => o.server_bin = val()?.into(),
            "--upstream-dir" => o.upstream_dir = val()?.into(),
            "--out" => o.out = val()?.into(),
            "--repo" => o.repo = val()?.into(),
            "--workloads" => {
                o.workloads = val()?.split(',').map(|s| s.trim().to_string()).collect();
                for w in &o.workloads {
                    if !ALL_WORKLOADS.contains(&w.as_str()) {
                        bail!("unknown workload {w:?} (known: {ALL_WORKLOADS:?})");
                    }
                }
            }
            "--bulk-mib" => o.bulk_bytes = val()?.parse::<u64>()? * MIB,
            "--short-secs" => o.short_secs = val()?.parse()?,
            "--short-clients" => o.short_clients = val()?.parse()?,
            "--idle-counts" => {
                o.idle_counts = val()?
                    .split(',')
                    .map(|s| s.trim().parse())
                    .collect::<Result<_, _>>()?
            }
            "--idle-secs" => o.idle_secs = val()?.parse()?,
            "--hol-secs" => o.hol_secs = val()?.parse()?,
            "--client-window" => match val()?.as_str() {
                "adaptive" => FIXED_WINDOW.store(false, Ordering::Relaxed),
                "fixed" => FIXED_WINDOW.store(true, Ordering::Relaxed),
                v => bail!("--client-window adaptive|fixed, not {v:?}"),
            },
            "-h" | "--help" => {
                println!("{}", usage());
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}\n{}", usage()),
        }
    }
    if o.server_bin.as_os_str().is_empty() || o.upstream_dir.as_os_str().is_empty() {
        bail!("--server-bin and --upstream-dir are required\n{}", usage());
    }
    if o.rounds == 0 {
        bail!("--rounds must be >= 1");
    }
    Ok(o)
}

// ============================================================================ main

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("farend") {
        farend_main();
    }
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => eprintln!(
            "konn_bench: RLIMIT_NOFILE soft limit = {n} (inherited by servers, agents, far end)"
        ),
        Err(e) => eprintln!("konn_bench: could not raise RLIMIT_NOFILE: {e}"),
    }
    let opts = match parse_opts(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("konn_bench: {e:#}");
            std::process::exit(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    // The orchestrating future runs on this (main) thread: every child process is spawned from
    // it, which PR_SET_PDEATHSIG requires (the signal follows the spawning thread).
    let code = rt.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            eprintln!("konn_bench: cannot install signal handlers");
            return 1;
        };
        // On SIGTERM/SIGINT the run future is dropped here, which kills every child.
        tokio::select! {
            r = run(opts) => match r {
                Ok(code) => code,
                Err(e) => {
                    eprintln!("konn_bench: FAILED: {e:#}");
                    1
                }
            },
            _ = term.recv() => {
                eprintln!("konn_bench: SIGTERM, stopping (children killed)");
                143
            }
            _ = int.recv() => {
                eprintln!("konn_bench: SIGINT, stopping (children killed)");
                130
            }
        }
    });
    if code >= 128 {
        // Interrupted: the children are gone; their logs and certificates need not stay.
        let _ = std::fs::remove_dir_all(
            std::env::temp_dir().join(format!("konn-bench-{}", std::process::id())),
        );
    }
    rt.shutdown_timeout(Duration::from_secs(2));
    std::process::exit(code);
}

// ============================================================================ data pattern

const UP_SEED_XOR: u64 = 0x5a5a_c3c3_0ff0_a55a;

#[inline]
fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The deterministic byte stream for one seed; `pos` is the next byte's offset.
struct Pattern {
    seed: u64,
    pos: u64,
}

impl Pattern {
    fn new(seed: u64) -> Self {
        Pattern { seed, pos: 0 }
    }
    #[inline]
    fn word(&self, idx: u64) -> u64 {
        splitmix(self.seed ^ idx.wrapping_mul(0xD6E8_FEB8_6659_FD93))
    }
    #[inline]
    fn byte(&self, pos: u64) -> u8 {
        self.word(pos / 8).to_le_bytes()[(pos % 8) as usize]
    }
    fn fill(&mut self, buf: &mut [u8]) {
        let mut i = 0;
        while i < buf.len() && !self.pos.is_multiple_of(8) {
            buf[i] = self.byte(self.pos);
            i += 1;
            self.pos += 1;
        }
        let n8 = (buf.len() - i) / 8 * 8;
        let base = self.pos / 8;
        for (k, c) in buf[i..i + n8].chunks_exact_mut(8).enumerate() {
            c.copy_from_slice(&self.word(base + k as u64).to_le_bytes());
        }
        self.pos += n8 as u64;
        i += n8;
        while i < buf.len() {
            buf[i] = self.byte(self.pos);
            i += 1;
            self.pos += 1;
        }
    }
    /// Compares `data` with the stream at `pos`; Err(offset) of the first mismatch.
    fn check(&mut self, data: &[u8]) -> Result<(), u64> {
        let mut i = 0;
        while i < data.len() && !self.pos.is_multiple_of(8) {
            if data[i] != self.byte(self.pos) {
                return Err(self.pos);
            }
            i += 1;
            self.pos += 1;
        }
        let n8 = (data.len() - i) / 8 * 8;
        let base = self.pos / 8;
        for (k, c) in data[i..i + n8].chunks_exact(8).enumerate() {
            if u64::from_le_bytes(c.try_into().unwrap()) != self.word(base + k as u64) {
                let at = self.pos + (k as u64) * 8;
                for j in 0..8u64 {
                    if c[j as usize] != self.byte(at + j) {
                        return Err(at + j);
                    }
                }
            }
        }
        self.pos += n8 as u64;
        i += n8;
        while i < data.len() {
            if data[i] != self.byte(self.pos) {
                return Err(self.pos);
            }
            i += 1;
            self.pos += 1;
        }
        Ok(())
    }
}

// ============================================================================ far-end protocol

const MAGIC: u32 = 0x4b4e_4231; // "KNB1"
const MODE_TRANSFER: u32 = 1; // send `down` bytes, then verify `up` bytes, then an 8-byte trailer
const MODE_STREAM: u32 = 2; // send the pattern until the peer goes away
const MODE_HOLD: u32 = 3; // send one ack byte, then wait for EOF
const HOLD_ACK: u8 = 0xAC;
const HEADER_LEN: usize = 32;
/// Trailer value when the upload ended early.
const TRAILER_SHORT: u64 = u64::MAX;

fn header(mode: u32, seed: u64, down: u64, up: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    h[4..8].copy_from_slice(&mode.to_le_bytes());
    h[8..16].copy_from_slice(&seed.to_le_bytes());
    h[16..24].copy_from_slice(&down.to_le_bytes());
    h[24..32].copy_from_slice(&up.to_le_bytes());
    h
}

fn farend_main() -> ! {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("far-end runtime");
    let r: Result<()> = rt.block_on(async {
        let mut rng = fastrand::Rng::new();
        let mut listener = None;
        for _ in 0..500 {
            let port = rng.u16(1024..=32767);
            if let Ok(l) = TcpListener::bind(("127.0.0.1", port)).await {
                listener = Some(l);
                break;
            }
        }
        let listener = listener.ok_or_else(|| anyhow!("no free port in [1024, 32767]"))?;
        println!("PORT {}", listener.local_addr()?.port());
        std::io::stdout().flush()?;
        // The parent holds our stdin: EOF means it is gone.
        std::thread::spawn(|| {
            let mut sink = [0u8; 64];
            let mut stdin = std::io::stdin();
            while let Ok(n) = std::io::Read::read(&mut stdin, &mut sink) {
                if n == 0 {
                    break;
                }
            }
            std::process::exit(0);
        });
        loop {
            let (s, _) = listener.accept().await?;
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                if let Err(e) = farend_conn(s).await {
                    eprintln!("farend: {e:#}");
                }
            });
        }
    });
    if let Err(e) = r {
        eprintln!("farend: {e:#}");
    }
    std::process::exit(1);
}

async fn farend_conn(mut s: TcpStream) -> Result<()> {
    let mut h = [0u8; HEADER_LEN];
    tokio::time::timeout(Duration::from_secs(120), s.read_exact(&mut h))
        .await
        .context("header timeout")??;
    let u32_at = |i: usize| u32::from_le_bytes(h[i..i + 4].try_into().unwrap());
    let u64_at = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().unwrap());
    if u32_at(0) != MAGIC {
        bail!("bad magic");
    }
    let (mode, seed, down, up) = (u32_at(4), u64_at(8), u64_at(16), u64_at(24));
    let mut buf = vec![0u8; 64 * 1024];
    match mode {
        MODE_TRANSFER => {
            let mut p = Pattern::new(seed);
            let mut left = down;
            while left > 0 {
                let n = left.min(buf.len() as u64) as usize;
                p.fill(&mut buf[..n]);
                s.write_all(&buf[..n]).await?;
                left -= n as u64;
            }
            let mut c = Pattern::new(seed ^ UP_SEED_XOR);
            let mut left = up;
            let mut status = 0u64;
            while left > 0 {
                let want = left.min(buf.len() as u64) as usize;
                let n = s.read(&mut buf[..want]).await?;
                if n == 0 {
                    status = TRAILER_SHORT;
                    break;
                }
                if status == 0 {
                    if let Err(off) = c.check(&buf[..n]) {
                        status = off + 1;
                    }
                }
                left -= n as u64;
            }
            s.write_all(&status.to_le_bytes()).await?;
            // The client closes the tunnel (CLOSE_REQ); the agent then closes this socket.
            let _ = tokio::time::timeout(Duration::from_secs(300), drain(&mut s, &mut buf)).await;
        }
        MODE_STREAM => {
            let mut p = Pattern::new(seed);
            loop {
                p.fill(&mut buf);
                if s.write_all(&buf).await.is_err() {
                    break;
                }
            }
        }
        MODE_HOLD => {
            s.write_all(&[HOLD_ACK]).await?;
            drain(&mut s, &mut buf).await;
        }
        m => bail!("unknown mode {m}"),
    }
    Ok(())
}

async fn drain(s: &mut TcpStream, buf: &mut [u8]) {
    while let Ok(n) = s.read(buf).await {
        if n == 0 {
            break;
        }
    }
}

// ============================================================================ processes

struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    fn spawn(name: &str, bin: &Path, args: &[String], log: &Path) -> Result<Proc> {
        let f = std::fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f);
        set_pdeathsig(&mut cmd);
        let child = cmd
            .spawn()
            .with_context(|| format!("spawn {name} ({})", bin.display()))?;
        Ok(Proc {
            name: name.to_string(),
            child,
            log: log.to_path_buf(),
        })
    }
    fn pid(&self) -> u32 {
        self.child.id()
    }
    fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(st)) => Some(st.to_string()),
            Ok(None) => None,
            Err(e) => Some(e.to_string()),
        }
    }
    fn tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
    fn log_contains(&self, s: &str) -> bool {
        std::fs::read_to_string(&self.log)
            .map(|t| t.contains(s))
            .unwrap_or(false)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // SAFETY: plain kill(2) on the process group this child leads (setpgid in pre_exec).
        unsafe {
            libc::kill(-(self.child.id() as libc::pid_t), libc::SIGKILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn set_pdeathsig(cmd: &mut Command) {
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Its own process group, so a wrapper's children die with it (see Drop).
            if libc::setpgid(0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// utime+stime of a process in seconds (all threads).
fn cpu_secs(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return f64::NAN;
    };
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
        return f64::NAN;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After "pid (comm) ": state is field 3, utime 14, stime 15.
    let ut: f64 = f.get(11).and_then(|s| s.parse().ok()).unwrap_or(f64::NAN);
    let st: f64 = f.get(12).and_then(|s| s.parse().ok()).unwrap_or(f64::NAN);
    (ut + st) / clk_tck()
}

fn self_cpu_secs() -> f64 {
    cpu_secs(std::process::id())
}

fn clk_tck() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// A field of /proc/<pid>/status in KiB (VmRSS, VmHWM).
fn status_kib(pid: u32, field: &str) -> f64 {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return f64::NAN;
    };
    for line in s.lines() {
        if let Some(rest) = line.strip_prefix(field).and_then(|r| r.strip_prefix(':')) {
            return rest
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .unwrap_or(f64::NAN);
        }
    }
    f64::NAN
}

// ============================================================================ ports, certs

struct Ports {
    used: HashSet<u16>,
    rng: fastrand::Rng,
}

impl Ports {
    /// A free port in [1024, 32767] on 127.0.0.1 (bind-checked, then released), never handed
    /// out twice in one invocation.
    fn alloc(&mut self) -> Result<u16> {
        for _ in 0..2000 {
            let p = self.rng.u16(1024..=32767);
            if self.used.contains(&p) {
                continue;
            }
            if StdTcpListener::bind(("127.0.0.1", p)).is_ok() {
                self.used.insert(p);
                return Ok(p);
            }
        }
        bail!("no free port in [1024, 32767]")
    }
}

struct Certs {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    agent_cert: PathBuf,
    agent_key: PathBuf,
}

fn gen_certs(dir: &Path) -> Result<Certs> {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
        KeyUsagePurpose,
    };
    let mut ca_params = CertificateParams::default();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "konn-bench CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = rcgen::CertifiedIssuer::self_signed(ca_params, KeyPair::generate()?)?;
    let leaf =
        |cn: &str, sans: Vec<String>, usage: ExtendedKeyUsagePurpose| -> Result<(String, String)> {
            let mut params = CertificateParams::new(sans)?;
            params.distinguished_name.push(DnType::CommonName, cn);
            params.extended_key_usages = vec![usage];
            let key = KeyPair::generate()?;
            let cert = params.signed_by(&key, &ca)?;
            Ok((cert.pem(), key.serialize_pem()))
        };
    let (sc, sk) = leaf(
        "proxy-server",
        vec!["localhost".into(), "127.0.0.1".into(), "::1".into()],
        ExtendedKeyUsagePurpose::ServerAuth,
    )?;
    let (ac, ak) = leaf("proxy-agent", vec![], ExtendedKeyUsagePurpose::ClientAuth)?;
    let c = Certs {
        ca: dir.join("ca.crt"),
        server_cert: dir.join("server.crt"),
        server_key: dir.join("server.key"),
        agent_cert: dir.join("agent.crt"),
        agent_key: dir.join("agent.key"),
    };
    std::fs::write(&c.ca, ca.pem())?;
    std::fs::write(&c.server_cert, sc)?;
    std::fs::write(&c.server_key, sk)?;
    std::fs::write(&c.agent_cert, ac)?;
    std::fs::write(&c.agent_key, ak)?;
    Ok(c)
}

// ============================================================================ context, env

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Impl {
    Ours,
    Go,
}

impl Impl {
    fn name(self) -> &'static str {
        match self {
            Impl::Ours => "ours",
            Impl::Go => "go",
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum FrontMode {
    Grpc,
    HttpConnect,
}

struct Ctx {
    opts: Opts,
    tmp: PathBuf,
    certs: Certs,
    ports: Mutex<Ports>,
    far: SocketAddr,
    far_pid: u32,
    seeds: AtomicU64,
    go_server: PathBuf,
    agent_bin: PathBuf,
    env_counter: AtomicU64,
}

impl Ctx {
    fn seed(&self) -> u64 {
        splitmix(self.seeds.fetch_add(1, Ordering::Relaxed))
    }
    fn port(&self) -> Result<u16> {
        self.ports.lock().unwrap().alloc()
    }
}

/// One server + one upstream agent. Drop kills the agent, then the server.
struct Env {
    agent: Proc,
    server: Proc,
    sock: PathBuf,
    #[allow(dead_code)]
    health_port: u16,
}

async fn http_get(port: u16, path: &str) -> Result<(u16, String)> {
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

async fn start_env(
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
            format!("--cluster-ca-cert={}", ctx.certs.ca.display()),
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
        let mut p = Proc::spawn(
            &format!("server-{}", imp.name()),
            &bin,
            &args,
            &dir.join(format!("server-{attempt}.log")),
        )?;
        let deadline = Instant::now() + Duration::from_secs(20);
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
        format!("--ca-cert={}", ctx.certs.ca.display()),
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
    let deadline = Instant::now() + Duration::from_secs(20);
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
                "{} server not ready with the agent within 20 s\n--- server ---\n{}\n--- agent ---\n{}",
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
    })
}

struct CpuSnap {
    client: f64,
    server: f64,
    agent: f64,
    sink: f64,
}

fn snap(ctx: &Ctx, env: Option<&Env>) -> CpuSnap {
    CpuSnap {
        client: self_cpu_secs(),
        server: env.map(|e| cpu_secs(e.server.pid())).unwrap_or(0.0),
        agent: env.map(|e| cpu_secs(e.agent.pid())).unwrap_or(0.0),
        sink: cpu_secs(ctx.far_pid),
    }
}

// ============================================================================ client tunnels

trait RawStream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> RawStream for T {}

struct GrpcLink {
    tx: Option<mpsc::Sender<Packet>>,
    rx: Streaming<Packet>,
    id: i64,
    closed: bool,
    // Dropped after the stream: a single-use tunnel's connection ends with it.
    _channel: Option<Channel>,
}

enum Link {
    Grpc(Box<GrpcLink>),
    Raw(Box<dyn RawStream>),
}

struct Tunnel {
    link: Link,
    leftover: Option<Bytes>,
    rbuf: BytesMut,
}

/// Upload chunk: what a TLS-record-sized writer (kubectl cp through exec) hands the client.
const UP_CHUNK: usize = 32 * 1024;

#[derive(Clone)]
enum Style {
    /// One HTTP/2 connection and one Proxy stream per dial (konnectivity-client single-use).
    Single,
    /// One shared HTTP/2 connection, one Proxy stream per dial.
    Reusable(Channel),
    /// HTTP CONNECT over the UDS (--mode=http-connect).
    Connect,
}

async fn uds_channel(sock: &Path) -> Result<Channel> {
    let path = sock.to_path_buf();
    let connector = tower::service_fn(move |_: http::Uri| {
        let path = path.clone();
        async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
    });
    // Adaptive (BDP) flow-control windows, as grpc-go (kube-apiserver) has by default;
    // `--client-window fixed` uses hyper's fixed defaults (2 MiB stream, 5 MiB connection).
    Endpoint::from_static("http://localhost")
        .http2_adaptive_window(!FIXED_WINDOW.load(Ordering::Relaxed))
        .connect_with_connector(connector)
        .await
        .context("UDS HTTP/2 connect")
}

fn pkt(t: PacketType, payload: Payload) -> Packet {
    Packet {
        r#type: t as i32,
        payload: Some(payload),
    }
}

async fn grpc_dial(channel: Channel, keep_channel: bool, far: SocketAddr) -> Result<Tunnel> {
    let (tx, rx) = mpsc::channel::<Packet>(16);
    let random = fastrand::i64(1..i64::MAX);
    tx.send(pkt(
        PacketType::DialReq,
        Payload::DialRequest(DialRequest {
            protocol: "tcp".into(),
            address: far.to_string(),
            random,
        }),
    ))
    .await
    .map_err(|_| anyhow!("send DIAL_REQ"))?;
    let mut client = ProxyServiceClient::new(channel.clone());
    let mut rx_stream = client
        .proxy(ReceiverStream::new(rx))
        .await
        .context("Proxy stream")?
        .into_inner();
    let id = loop {
        let p = rx_stream
            .message()
            .await
            .context("waiting for DIAL_RSP")?
            .ok_or_else(|| anyhow!("stream ended before DIAL_RSP"))?;
        if let Some(Payload::DialResponse(d)) = p.payload {
            if d.random != random {
                continue;
            }
            if !d.error.is_empty() {
                bail!("dial failed: {}", d.error);
            }
            break d.connect_id;
        }
    };
    Ok(Tunnel {
        link: Link::Grpc(Box::new(GrpcLink {
            tx: Some(tx),
            rx: rx_stream,
            id,
            closed: false,
            _channel: if keep_channel { Some(channel) } else { None },
        })),
        leftover: None,
        rbuf: BytesMut::new(),
    })
}

async fn connect_dial(sock: &Path, far: SocketAddr) -> Result<Tunnel> {
    let mut s = UnixStream::connect(sock).await.context("UDS connect")?;
    s.write_all(
        format!("CONNECT {far} HTTP/1.1\r\nHost: {far}\r\nUser-Agent: konn-bench\r\n\r\n")
            .as_bytes(),
    )
    .await?;
    let mut buf = BytesMut::with_capacity(4096);
    let end = loop {
        if s.read_buf(&mut buf).await? == 0 {
            bail!(
                "EOF before the CONNECT response: {:?}",
                String::from_utf8_lossy(&buf)
            );
        }
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > 16 * 1024 {
            bail!("CONNECT response head too long");
        }
    };
    let head = buf.split_to(end);
    if !head.starts_with(b"HTTP/1.1 200") && !head.starts_with(b"HTTP/1.0 200") {
        bail!("CONNECT failed: {:?}", String::from_utf8_lossy(&head));
    }
    Ok(Tunnel {
        leftover: if buf.is_empty() {
            None
        } else {
            Some(buf.freeze())
        },
        link: Link::Raw(Box::new(s)),
        rbuf: BytesMut::new(),
    })
}

async fn dial(style: &Style, sock: &Path, far: SocketAddr) -> Result<Tunnel> {
    match style {
        Style::Single => {
            let ch = uds_channel(sock).await?;
            grpc_dial(ch, true, far).await
        }
        Style::Reusable(ch) => grpc_dial(ch.clone(), false, far).await,
        Style::Connect => connect_dial(sock, far).await,
    }
}

async fn direct_dial(far: SocketAddr) -> Result<Tunnel> {
    let s = TcpStream::connect(far).await?;
    s.set_nodelay(true)?;
    Ok(Tunnel {
        link: Link::Raw(Box::new(s)),
        leftover: None,
        rbuf: BytesMut::new(),
    })
}

impl Tunnel {
    async fn send(&mut self, data: Bytes) -> Result<()> {
        match &mut self.link {
            Link::Grpc(g) => {
                let tx = g.tx.as_ref().ok_or_else(|| anyhow!("send side closed"))?;
                tx.send(pkt(
                    PacketType::Data,
                    Payload::Data(Data {
                        connect_id: g.id,
                        error: String::new(),
                        data,
                    }),
                ))
                .await
                .map_err(|_| anyhow!("tunnel stream closed while sending"))
            }
            Link::Raw(s) => Ok(s.write_all(&data).await?),
        }
    }

    /// The next chunk of tunnel data; None at the end (CLOSE_RSP, stream end or EOF).
    async fn recv(&mut self) -> Result<Option<Bytes>> {
        if let Some(b) = self.leftover.take() {
            return Ok(Some(b));
        }
        match &mut self.link {
            Link::Grpc(g) => loop {
                if g.closed {
                    return Ok(None);
                }
                match g.rx.message().await.context("tunnel stream")? {
                    None => {
                        g.closed = true;
                        return Ok(None);
                    }
                    Some(p) => match p.payload {
                        Some(Payload::Data(d)) => {
                            if !d.error.is_empty() {
                                bail!("DATA error: {}", d.error);
                            }
                            if !d.data.is_empty() {
                                return Ok(Some(d.data));
                            }
                        }
                        Some(Payload::CloseResponse(_)) => {
                            g.closed = true;
                            return Ok(None);
                        }
                        _ => {}
                    },
                }
            },
            Link::Raw(s) => {
                if self.rbuf.capacity() - self.rbuf.len() < 16 * 1024 {
                    self.rbuf.reserve(64 * 1024);
                }
                let n = s.read_buf(&mut self.rbuf).await?;
                if n == 0 {
                    Ok(None)
                } else {
                    Ok(Some(self.rbuf.split().freeze()))
                }
            }
        }
    }

    /// Reads exactly `n` bytes, comparing each with the pattern.
    async fn read_verify(&mut self, n: u64, p: &mut Pattern) -> Result<()> {
        let mut left = n;
        while left > 0 {
            let mut b = self
                .recv()
                .await?
                .ok_or_else(|| anyhow!("tunnel ended after {} of {n} bytes", n - left))?;
            if b.len() as u64 > left {
                self.leftover = Some(b.split_off(left as usize));
            }
            p.check(&b)
                .map_err(|off| anyhow!("DATA MISMATCH at offset {off} of the download"))?;
            left -= b.len() as u64;
        }
        Ok(())
    }

    async fn read_exact_vec(&mut self, n: usize) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(n);
        while out.len() < n {
            let mut b = self
                .recv()
                .await?
                .ok_or_else(|| anyhow!("tunnel ended after {} of {n} bytes", out.len()))?;
            if b.len() > n - out.len() {
                self.leftover = Some(b.split_off(n - out.len()));
            }
            out.extend_from_slice(&b);
        }
        Ok(out)
    }

    async fn send_pattern(&mut self, n: u64, p: &mut Pattern) -> Result<()> {
        let mut left = n;
        while left > 0 {
            let k = left.min(UP_CHUNK as u64) as usize;
            let mut b = BytesMut::zeroed(k);
            p.fill(&mut b);
            self.send(b.freeze()).await?;
            left -= k as u64;
        }
        Ok(())
    }

    /// Reads the far end's trailer and fails on a reported mismatch.
    async fn check_trailer(&mut self) -> Result<()> {
        let t = self.read_exact_vec(8).await?;
        let v = u64::from_le_bytes(t.try_into().unwrap());
        match v {
            0 => Ok(()),
            TRAILER_SHORT => bail!("DATA MISMATCH: the far end got a short upload"),
            off => bail!(
                "DATA MISMATCH at offset {} of the upload (far end)",
                off - 1
            ),
        }
    }

    /// gRPC: CLOSE_REQ, then wait for CLOSE_RSP; raw: shutdown and drop.
    async fn close(mut self) -> Result<()> {
        match &mut self.link {
            Link::Grpc(g) => {
                if !g.closed {
                    let tx = g.tx.as_ref().ok_or_else(|| anyhow!("send side closed"))?;
                    tx.send(pkt(
                        PacketType::CloseReq,
                        Payload::CloseRequest(CloseRequest { connect_id: g.id }),
                    ))
                    .await
                    .map_err(|_| anyhow!("stream closed before CLOSE_REQ"))?;
                    loop {
                        match g.rx.message().await.context("waiting for CLOSE_RSP")? {
                            None => bail!("stream ended without CLOSE_RSP"),
                            Some(Packet {
                                payload: Some(Payload::CloseResponse(_)),
                                ..
                            }) => break,
                            Some(_) => {}
                        }
                    }
                }
                g.tx = None;
                Ok(())
            }
            Link::Raw(s) => {
                let _ = s.shutdown().await;
                Ok(())
            }
        }
    }
}

// ============================================================================ results

type Metrics = BTreeMap<String, f64>;

#[derive(Clone, Debug)]
struct Record {
    workload: String,
    imp: String,
    round: usize,
    metrics: Metrics,
    error: Option<String>,
    notes: Vec<String>,
    secs: f64,
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[idx.min(sorted.len() - 1)]
}

fn median(v: &[f64]) -> f64 {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return f64::NAN;
    }
    s.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

// ============================================================================ workloads

struct Outcome {
    metrics: Metrics,
    notes: Vec<String>,
}

impl Outcome {
    fn new() -> Self {
        Outcome {
            metrics: Metrics::new(),
            notes: Vec::new(),
        }
    }
    fn set(&mut self, k: &str, v: f64) {
        self.metrics.insert(k.to_string(), v);
    }
}

/// The bulk transfer on one tunnel: `n` bytes down, then `n` bytes up; shared by bulk and limit.
async fn bulk_transfer(ctx: &Ctx, t: &mut Tunnel, n: u64, o: &mut Outcome) -> Result<()> {
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

fn cpu_split(o: &mut Outcome, a: &CpuSnap, b: &CpuSnap, gib: f64, with_server: bool) {
    if with_server {
        o.set("server_cpu_s_per_gib", (b.server - a.server) / gib);
        o.set("agent_cpu_s_per_gib", (b.agent - a.agent) / gib);
    }
    o.set("client_cpu_s_per_gib", (b.client - a.client) / gib);
    o.set("sink_cpu_s_per_gib", (b.sink - a.sink) / gib);
}

async fn w_bulk(ctx: &Ctx, imp: Impl) -> Result<Outcome> {
    let env = start_env(ctx, imp, FrontMode::Grpc, "bulk", &[]).await?;
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

async fn w_limit(ctx: &Ctx) -> Result<Outcome> {
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

/// One short tunnel: dial, 1 KiB each way (checked), close. Returns the dial latency.
async fn short_one(style: &Style, sock: &Path, far: SocketAddr, seed: u64) -> Result<Duration> {
    let t0 = Instant::now();
    let mut t = dial(style, sock, far).await?;
    let lat = t0.elapsed();
    let n = KIB;
    let mut req = BytesMut::with_capacity(HEADER_LEN + n as usize);
    req.extend_from_slice(&header(MODE_TRANSFER, seed, n, n));
    let mut up = vec![0u8; n as usize];
    Pattern::new(seed ^ UP_SEED_XOR).fill(&mut up);
    req.extend_from_slice(&up);
    t.send(req.freeze()).await?;
    t.read_verify(n, &mut Pattern::new(seed)).await?;
    t.check_trailer().await?;
    t.close().await?;
    Ok(lat)
}

async fn w_short(ctx: &Ctx, imp: Impl, which: &str) -> Result<Outcome> {
    let mode = if which == "connect" {
        FrontMode::HttpConnect
    } else {
        FrontMode::Grpc
    };
    let env = start_env(ctx, imp, mode, &format!("short-{which}"), &[]).await?;
    let style = match which {
        "single" => Style::Single,
        "reusable" => Style::Reusable(uds_channel(&env.sock).await?),
        _ => Style::Connect,
    };
    let dur = Duration::from_secs_f64(ctx.opts.short_secs);
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
            let mut lats = Vec::new();
            let mut errs: Vec<String> = Vec::new();
            let mut i = 0u64;
            while Instant::now() < stop {
                let seed = splitmix(base_seed ^ ((w as u64) << 40) ^ i);
                i += 1;
                match tokio::time::timeout(
                    Duration::from_secs(10),
                    short_one(&style, &sock, far, seed),
                )
                .await
                {
                    Ok(Ok(l)) => lats.push(l.as_secs_f64()),
                    Ok(Err(e)) => errs.push(format!("{e:#}")),
                    Err(_) => errs.push("short tunnel timed out (10 s)".into()),
                }
            }
            (lats, errs)
        });
    }
    let mut lats = Vec::new();
    let mut errs = Vec::new();
    let joined = tokio::time::timeout(dur + Duration::from_secs(30), async {
        while let Some(r) = set.join_next().await {
            let (l, e) = r?;
            lats.extend(l);
            errs.extend(e);
        }
        Ok::<_, anyhow::Error>(())
    })
    .await;
    let elapsed = t0.elapsed().as_secs_f64();
    let b = snap(ctx, Some(&env));
    joined.context("short-tunnel clients did not finish")??;
    let ok = lats.len() as f64;
    lats.sort_by(|x, y| x.partial_cmp(y).unwrap());
    let mut o = Outcome::new();
    o.set("tunnels_per_s", ok / elapsed);
    o.set("dial_p50_ms", percentile(&lats, 0.50) * 1e3);
    o.set("dial_p99_ms", percentile(&lats, 0.99) * 1e3);
    o.set("server_cpu_us_per_tunnel", (b.server - a.server) / ok * 1e6);
    o.set("agent_cpu_us_per_tunnel", (b.agent - a.agent) / ok * 1e6);
    o.set("errors", errs.len() as f64);
    if !errs.is_empty() {
        let mut uniq: Vec<String> = errs.clone();
        uniq.sort();
        uniq.dedup();
        let msg = format!(
            "{} failed short tunnels, e.g.: {}",
            errs.len(),
            uniq.iter().take(3).cloned().collect::<Vec<_>>().join(" | ")
        );
        if errs.iter().any(|e| e.contains("MISMATCH")) {
            bail!(msg);
        }
        o.notes.push(msg);
    }
    drop(style);
    Ok(o)
}

async fn open_idle(env_sock: &Path, far: SocketAddr, n: usize, seed0: u64) -> Result<Vec<Tunnel>> {
    let sem = Arc::new(Semaphore::new(64));
    let mut set = JoinSet::new();
    for i in 0..n {
        let sem = sem.clone();
        let sock = env_sock.to_path_buf();
        set.spawn(async move {
            let _permit = sem.acquire_owned().await?;
            let fut = async {
                let mut t = dial(&Style::Single, &sock, far).await?;
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

async fn close_all(tunnels: Vec<Tunnel>, each: Duration) -> (usize, Vec<String>) {
    let sem = Arc::new(Semaphore::new(64));
    let mut set = JoinSet::new();
    for t in tunnels {
        let sem = sem.clone();
        set.spawn(async move {
            let _permit = sem.acquire_owned().await;
            match tokio::time::timeout(each, t.close()).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(format!("{e:#}")),
                Err(_) => Err(format!("close timed out ({} s)", each.as_secs())),
            }
        });
    }
    let mut ok = 0;
    let mut errs = Vec::new();
    while let Some(r) = set.join_next().await {
        match r {
            Ok(Ok(())) => ok += 1,
            Ok(Err(e)) => errs.push(e),
            Err(e) => errs.push(e.to_string()),
        }
    }
    (ok, errs)
}

fn summarize_errs(what: &str, errs: &[String]) -> Option<String> {
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

async fn w_idle(ctx: &Ctx, imp: Impl, n: usize) -> Result<Outcome> {
    let env = start_env(ctx, imp, FrontMode::Grpc, &format!("idle{n}"), &[]).await?;
    let pid = env.server.pid();
    // Warm-up: let lazily built state exist before the baseline.
    let warm = open_idle(&env.sock, ctx.far, 10, ctx.seed()).await?;
    let (_, errs) = close_all(warm, Duration::from_secs(10)).await;
    if let Some(e) = summarize_errs("warm-up closes failed", &errs) {
        bail!(e);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss0 = status_kib(pid, "VmRSS");
    let t0 = Instant::now();
    let tunnels = open_idle(&env.sock, ctx.far, n, ctx.seed()).await?;
    let open_s = t0.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs_f64(ctx.opts.idle_settle_secs)).await;
    let c0 = cpu_secs(pid);
    let w0 = Instant::now();
    tokio::time::sleep(Duration::from_secs_f64(ctx.opts.idle_secs)).await;
    let c1 = cpu_secs(pid);
    let window = w0.elapsed().as_secs_f64();
    let rss1 = status_kib(pid, "VmRSS");
    let mut o = Outcome::new();
    o.set("rss_kib_per_tunnel", (rss1 - rss0) / n as f64);
    o.set("rss_mib_total", rss1 / 1024.0);
    o.set("idle_cpu_ms_per_s", (c1 - c0) * 1e3 / window);
    o.set("open_per_s", n as f64 / open_s);
    let (_, errs) = close_all(tunnels, Duration::from_secs(20)).await;
    if let Some(e) = summarize_errs("idle-tunnel closes failed", &errs) {
        o.notes.push(e);
    }
    Ok(o)
}

/// `k` streaming tunnels read (and check) for `secs`; the dials count inside the window.
/// Returns (MB/s over all tunnels, notes).
async fn hol_active(ctx: &Ctx, sock: &Path, k: usize, secs: f64) -> Result<(f64, Vec<String>)> {
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
                    return Ok((
                        0u64,
                        Some("active dial did not finish in the window".to_string()),
                        None,
                    ))
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
    let mut notes: Vec<String> = Vec::new();
    let mut tunnels = Vec::new();
    let joined = tokio::time::timeout(Duration::from_secs_f64(secs + 30.0), async {
        while let Some(r) = set.join_next().await {
            let (b, note, t) = r??;
            total += b;
            notes.extend(note);
            tunnels.extend(t);
        }
        Ok::<_, anyhow::Error>(())
    })
    .await;
    let elapsed = start.elapsed().as_secs_f64().max(secs);
    joined.context("active tunnels did not finish")??;
    let mut notes: Vec<String> = match summarize_errs("of the active tunnels", &notes) {
        Some(n) => vec![n],
        None => vec![],
    };
    let (_, errs) = close_all(tunnels, Duration::from_secs(3)).await;
    notes.extend(summarize_errs("active-tunnel closes failed", &errs));
    Ok((total as f64 / 1e6 / elapsed, notes))
}

async fn w_hol(ctx: &Ctx, imp: Impl) -> Result<Outcome> {
    let extra: &[&str] = match imp {
        Impl::Ours => &["--frontend-queue-stall-timeout=2s"],
        Impl::Go => &[],
    };
    let env = start_env(ctx, imp, FrontMode::Grpc, "hol", extra).await?;
    let k = ctx.opts.hol_active;
    let secs = ctx.opts.hol_secs;
    let mut o = Outcome::new();
    let (alone, notes) = hol_active(ctx, &env.sock, k, secs).await?;
    o.notes
        .extend(notes.into_iter().map(|n| format!("without stalled: {n}")));
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
    let (with, notes) = hol_active(ctx, &env.sock, k, secs).await?;
    o.notes
        .extend(notes.into_iter().map(|n| format!("with stalled: {n}")));
    drop(stalled);
    o.set("active_mbps_alone", alone);
    o.set("active_mbps_with_stalled", with);
    o.set(
        "share_pct",
        if alone > 0.0 {
            with / alone * 100.0
        } else {
            f64::NAN
        },
    );
    Ok(o)
}

// ============================================================================ orchestration

struct Job {
    workload: String,
    imp: Option<Impl>,
}

fn jobs_for_round(opts: &Opts, round: usize) -> Vec<Job> {
    let order = if round % 2 == 1 {
        [Impl::Ours, Impl::Go]
    } else {
        [Impl::Go, Impl::Ours]
    };
    let mut out = Vec::new();
    for w in &opts.workloads {
        let names: Vec<String> = match w.as_str() {
            "bulk" => vec!["bulk".into()],
            "short" => vec![
                "short-single".into(),
                "short-reusable".into(),
                "short-connect".into(),
            ],
            "idle" => opts
                .idle_counts
                .iter()
                .map(|n| format!("idle-{n}"))
                .collect(),
            "hol" => vec!["hol".into()],
            "limit" => {
                out.push(Job {
                    workload: "limit".into(),
                    imp: None,
                });
                continue;
            }
            _ => unreachable!(),
        };
        for name in names {
            for imp in order {
                out.push(Job {
                    workload: name.clone(),
                    imp: Some(imp),
                });
            }
        }
    }
    out
}

fn job_deadline(opts: &Opts, w: &str) -> Duration {
    let s = match w {
        "bulk" | "limit" => 60.0 + 2.0 * opts.bulk_bytes as f64 / 5e6,
        w if w.starts_with("short") => 60.0 + opts.short_secs,
        w if w.starts_with("idle") => {
            let n: f64 = w.trim_start_matches("idle-").parse().unwrap_or(1000.0);
            120.0 + n / 50.0 + opts.idle_secs + opts.idle_settle_secs
        }
        "hol" => 120.0 + 2.0 * opts.hol_secs,
        _ => 300.0,
    };
    Duration::from_secs_f64(s)
}

async fn run_job(ctx: &Ctx, w: &str, imp: Option<Impl>) -> Result<Outcome> {
    match (w, imp) {
        ("limit", _) => w_limit(ctx).await,
        ("bulk", Some(i)) => w_bulk(ctx, i).await,
        ("hol", Some(i)) => w_hol(ctx, i).await,
        (s, Some(i)) if s.starts_with("short-") => w_short(ctx, i, &s["short-".len()..]).await,
        (s, Some(i)) if s.starts_with("idle-") => w_idle(ctx, i, s["idle-".len()..].parse()?).await,
        _ => bail!("unknown job {w}"),
    }
}

fn brief(m: &Metrics) -> String {
    let keys = [
        ("mbps", "MB/s"),
        ("server_cpu_s_per_gib", "srv s/GiB"),
        ("peak_rss_mib", "peak MiB"),
        ("tunnels_per_s", "tun/s"),
        ("dial_p99_ms", "p99 ms"),
        ("server_cpu_us_per_tunnel", "srv us/tun"),
        ("rss_kib_per_tunnel", "KiB/tun"),
        ("idle_cpu_ms_per_s", "idle ms/s"),
        ("share_pct", "share %"),
    ];
    keys.iter()
        .filter_map(|(k, l)| m.get(*k).map(|v| format!("{l} {}", fmt_num(*v))))
        .collect::<Vec<_>>()
        .join(", ")
}

async fn run(opts: Opts) -> Result<i32> {
    let started = Instant::now();
    let go_server = opts.upstream_dir.join("proxy-server");
    let agent_bin = opts.upstream_dir.join("proxy-agent");
    for b in [&opts.server_bin, &go_server, &agent_bin] {
        if !b.is_file() {
            bail!("missing binary {}", b.display());
        }
    }
    std::fs::create_dir_all(&opts.out)?;
    let tmp = std::env::temp_dir().join(format!("konn-bench-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let certs = gen_certs(&tmp)?;

    // The far end: this binary in its own process.
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(&exe);
    cmd.arg("farend")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(tmp.join("farend.log"))?);
    set_pdeathsig(&mut cmd);
    let mut far_child = cmd.spawn().context("spawn far end")?;
    let stdout = far_child.stdout.take().unwrap();
    let (ptx, prx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = ptx.send(line);
    });
    let line = prx
        .recv_timeout(Duration::from_secs(10))
        .context("far end did not report its port")?;
    let port: u16 = line
        .trim()
        .strip_prefix("PORT ")
        .and_then(|p| p.parse().ok())
        .ok_or_else(|| anyhow!("far end said {line:?}"))?;
    let far_pid = far_child.id();
    let far_guard = Proc {
        name: "farend".into(),
        child: far_child,
        log: tmp.join("farend.log"),
    };

    let ctx = Ctx {
        opts: opts.clone(),
        tmp: tmp.clone(),
        certs,
        ports: Mutex::new(Ports {
            used: HashSet::from([port]),
            rng: fastrand::Rng::with_seed(std::process::id() as u64 ^ 0x6b6f6e6e),
        }),
        far: SocketAddr::from(([127, 0, 0, 1], port)),
        far_pid,
        seeds: AtomicU64::new(0x1234_5678),
        go_server,
        agent_bin,
        env_counter: AtomicU64::new(0),
    };
    eprintln!(
        "konn_bench: {} mode, {} round(s), workloads {:?}; far end 127.0.0.1:{port}; work dir {}",
        if opts.quick { "quick" } else { "full" },
        opts.rounds,
        opts.workloads,
        tmp.display()
    );

    let mut records: Vec<Record> = Vec::new();
    let mut failed = false;
    for round in 1..=opts.rounds {
        for job in jobs_for_round(&opts, round) {
            let who = job.imp.map(|i| i.name()).unwrap_or("direct");
            let t0 = Instant::now();
            let r = tokio::time::timeout(
                job_deadline(&opts, &job.workload),
                run_job(&ctx, &job.workload, job.imp),
            )
            .await;
            let secs = t0.elapsed().as_secs_f64();
            let rec = match r {
                Ok(Ok(o)) => {
                    eprintln!(
                        "[round {round}/{}] {:<15} {:<6} {:>6.1}s  {}{}",
                        opts.rounds,
                        job.workload,
                        who,
                        secs,
                        brief(&o.metrics),
                        if o.notes.is_empty() {
                            String::new()
                        } else {
                            format!("  (notes: {})", o.notes.join("; "))
                        }
                    );
                    Record {
                        workload: job.workload.clone(),
                        imp: who.into(),
                        round,
                        metrics: o.metrics,
                        error: None,
                        notes: o.notes,
                        secs,
                    }
                }
                Ok(Err(e)) => {
                    failed = true;
                    eprintln!(
                        "[round {round}/{}] {:<15} {:<6} FAILED after {secs:.1}s: {e:#}",
                        opts.rounds, job.workload, who
                    );
                    Record {
                        workload: job.workload.clone(),
                        imp: who.into(),
                        round,
                        metrics: Metrics::new(),
                        error: Some(format!("{e:#}")),
                        notes: vec![],
                        secs,
                    }
                }
                Err(_) => {
                    failed = true;
                    eprintln!(
                        "[round {round}/{}] {:<15} {:<6} TIMED OUT after {secs:.1}s",
                        opts.rounds, job.workload, who
                    );
                    Record {
                        workload: job.workload.clone(),
                        imp: who.into(),
                        round,
                        metrics: Metrics::new(),
                        error: Some(format!("timed out after {secs:.0} s")),
                        notes: vec![],
                        secs,
                    }
                }
            };
            records.push(rec);
        }
    }
    drop(far_guard);
    let total = started.elapsed().as_secs_f64();

    let info = machine_info(&opts);
    write_json(&opts, &records, &info, total)?;
    let md = render_markdown(&opts, &records, &info, total);
    std::fs::write(opts.out.join("RESULTS.md"), &md)?;
    write_ratios_csv(&opts, &records)?;
    print!("{}", summary_tables(&opts, &records));
    eprintln!(
        "konn_bench: wrote {} ({:.0} s of benchmarks)",
        opts.out.join("RESULTS.md").display(),
        total
    );
    if failed || opts.keep_tmp {
        eprintln!("konn_bench: logs kept in {}", tmp.display());
    } else {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    Ok(if failed { 1 } else { 0 })
}

// ============================================================================ report

struct MetricDef {
    workload: &'static str,
    key: &'static str,
    label: &'static str,
    higher_better: bool,
    /// Target ratio ours/Go (<= for lower-is-better, >= for higher-is-better) and its kind.
    target: Option<(f64, &'static str)>,
}

const fn m(
    workload: &'static str,
    key: &'static str,
    label: &'static str,
    higher_better: bool,
    target: Option<(f64, &'static str)>,
) -> MetricDef {
    MetricDef {
        workload,
        key,
        label,
        higher_better,
        target,
    }
}

const DEFS: &[MetricDef] = &[
    m(
        "bulk",
        "mbps",
        "end-to-end MB/s (down+up)",
        true,
        Some((1.2, "aim")),
    ),
    m("bulk", "down_mbps", "download MB/s", true, None),
    m("bulk", "up_mbps", "upload MB/s", true, None),
    m(
        "bulk",
        "server_cpu_s_per_gib",
        "server CPU s per GiB",
        false,
        Some((0.5, "target")),
    ),
    m(
        "bulk",
        "peak_rss_mib",
        "server peak RSS MiB (VmHWM)",
        false,
        None,
    ),
    m(
        "bulk",
        "client_cpu_s_per_gib",
        "CPU split: client s/GiB",
        false,
        None,
    ),
    m(
        "bulk",
        "agent_cpu_s_per_gib",
        "CPU split: agent s/GiB",
        false,
        None,
    ),
    m(
        "bulk",
        "sink_cpu_s_per_gib",
        "CPU split: far end s/GiB",
        false,
        None,
    ),
    m(
        "short-single",
        "tunnels_per_s",
        "tunnels/s",
        true,
        Some((1.5, "aim")),
    ),
    m(
        "short-single",
        "dial_p50_ms",
        "dial latency p50 ms",
        false,
        None,
    ),
    m(
        "short-single",
        "dial_p99_ms",
        "dial latency p99 ms",
        false,
        Some((0.5, "aim")),
    ),
    m(
        "short-single",
        "server_cpu_us_per_tunnel",
        "server CPU us per tunnel",
        false,
        Some((0.5, "target")),
    ),
    m(
        "short-single",
        "agent_cpu_us_per_tunnel",
        "agent CPU us per tunnel",
        false,
        None,
    ),
    m("short-single", "errors", "failed tunnels", false, None),
    m("short-reusable", "tunnels_per_s", "tunnels/s", true, None),
    m(
        "short-reusable",
        "dial_p50_ms",
        "dial latency p50 ms",
        false,
        None,
    ),
    m(
        "short-reusable",
        "dial_p99_ms",
        "dial latency p99 ms",
        false,
        None,
    ),
    m(
        "short-reusable",
        "server_cpu_us_per_tunnel",
        "server CPU us per tunnel",
        false,
        None,
    ),
    m("short-reusable", "errors", "failed tunnels", false, None),
    m("short-connect", "tunnels_per_s", "tunnels/s", true, None),
    m(
        "short-connect",
        "dial_p50_ms",
        "dial latency p50 ms",
        false,
        None,
    ),
    m(
        "short-connect",
        "dial_p99_ms",
        "dial latency p99 ms",
        false,
        None,
    ),
    m(
        "short-connect",
        "server_cpu_us_per_tunnel",
        "server CPU us per tunnel",
        false,
        None,
    ),
    m("short-connect", "errors", "failed tunnels", false, None),
    m(
        "idle",
        "rss_kib_per_tunnel",
        "server RSS KiB per tunnel",
        false,
        Some((0.25, "target")),
    ),
    m(
        "idle",
        "rss_mib_total",
        "server RSS MiB with all open",
        false,
        None,
    ),
    m(
        "idle",
        "idle_cpu_ms_per_s",
        "server CPU while idle, ms/s",
        false,
        None,
    ),
    m(
        "idle",
        "open_per_s",
        "tunnels opened per s (64 at a time)",
        true,
        None,
    ),
    m("hol", "share_pct", "active throughput share %", true, None),
    m(
        "hol",
        "active_mbps_alone",
        "10 active, MB/s, no stalled tunnel",
        true,
        None,
    ),
    m(
        "hol",
        "active_mbps_with_stalled",
        "10 active, MB/s, with a stalled tunnel",
        true,
        None,
    ),
];

fn defs_for(workload: &str) -> Vec<&'static MetricDef> {
    let base = if workload.starts_with("idle-") {
        "idle"
    } else {
        workload
    };
    DEFS.iter().filter(|d| d.workload == base).collect()
}

fn fmt_num(v: f64) -> String {
    if !v.is_finite() {
        return "n/a".into();
    }
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 1000.0 {
        format!("{v:.0}")
    } else if a >= 100.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

fn values(records: &[Record], w: &str, imp: &str, key: &str) -> Vec<(usize, f64)> {
    records
        .iter()
        .filter(|r| r.workload == w && r.imp == imp && r.error.is_none())
        .filter_map(|r| r.metrics.get(key).map(|v| (r.round, *v)))
        .collect()
}

struct Cell {
    med: f64,
    min: f64,
    max: f64,
    n: usize,
}

fn cell(vals: &[(usize, f64)]) -> Cell {
    let v: Vec<f64> = vals.iter().map(|x| x.1).filter(|x| x.is_finite()).collect();
    Cell {
        med: median(&v),
        min: v.iter().copied().fold(f64::INFINITY, f64::min),
        max: v.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        n: v.len(),
    }
}

fn fmt_cell(c: &Cell) -> String {
    if c.n == 0 {
        "n/a".into()
    } else if c.n == 1 || c.min == c.max {
        fmt_num(c.med)
    } else {
        format!("{} ({}–{})", fmt_num(c.med), fmt_num(c.min), fmt_num(c.max))
    }
}

/// Ratio of medians ours/Go, plus the range of the per-round ratios.
fn ratio(records: &[Record], w: &str, key: &str) -> (f64, f64, f64) {
    let o = values(records, w, "ours", key);
    let g = values(records, w, "go", key);
    let r = median(&o.iter().map(|x| x.1).collect::<Vec<_>>())
        / median(&g.iter().map(|x| x.1).collect::<Vec<_>>());
    let per: Vec<f64> = o
        .iter()
        .filter_map(|(round, ov)| g.iter().find(|(gr, _)| gr == round).map(|(_, gv)| ov / gv))
        .filter(|x| x.is_finite())
        .collect();
    let lo = per.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = per.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (r, lo, hi)
}

fn workload_names(records: &[Record]) -> Vec<String> {
    let mut seen = Vec::new();
    for r in records {
        if !seen.contains(&r.workload) {
            seen.push(r.workload.clone());
        }
    }
    seen
}

fn title(w: &str, opts: &Opts) -> String {
    match w {
        "bulk" => format!("1. Bulk: one single-use gRPC tunnel, {} down then {} up", size(opts.bulk_bytes), size(opts.bulk_bytes)),
        "short-single" => format!("2a. Short tunnels, single-use gRPC (new UDS connection + Proxy stream per dial; {} clients, 1 KiB each way, {} s)", opts.short_clients, opts.short_secs),
        "short-reusable" => format!("2b. Short tunnels, reusable gRPC (one UDS connection, one Proxy stream per dial; {} clients, {} s)", opts.short_clients, opts.short_secs),
        "short-connect" => format!("2c. Short tunnels, HTTP-CONNECT over the UDS (--mode=http-connect; {} clients, {} s)", opts.short_clients, opts.short_secs),
        w if w.starts_with("idle-") => format!("3. Idle tunnels: {} open single-use gRPC tunnels", &w[5..]),
        "hol" => format!("4. Head-of-line: {} active streaming tunnels with and without one stalled tunnel on the same agent ({} s each)", opts.hol_active, opts.hol_secs),
        "limit" => format!("5. The limit: the bulk transfer over a direct loopback TCP connection ({} each way)", size(opts.bulk_bytes)),
        _ => w.to_string(),
    }
}

fn size(b: u64) -> String {
    if b >= GIB && b.is_multiple_of(GIB) {
        format!("{} GiB", b / GIB)
    } else {
        format!("{} MiB", b / MIB)
    }
}

fn target_text(d: &MetricDef) -> String {
    match d.target {
        None => String::new(),
        Some((t, kind)) => format!("{kind} {}{t}x", if d.higher_better { "≥ " } else { "≤ " }),
    }
}

fn met(d: &MetricDef, r: f64) -> &'static str {
    match d.target {
        None => "",
        Some(_) if !r.is_finite() => "n/a",
        Some((t, _)) => {
            if (d.higher_better && r >= t) || (!d.higher_better && r <= t) {
                "yes"
            } else {
                "no"
            }
        }
    }
}

fn table_for(opts: &Opts, records: &[Record], w: &str) -> String {
    let mut s = String::new();
    if w == "limit" {
        let _ = writeln!(
            s,
            "| metric | direct | ours as % of direct | Go as % of direct |\n|---|---|---|---|"
        );
        for (key, label) in [
            ("mbps", "end-to-end MB/s (down+up)"),
            ("down_mbps", "download MB/s"),
            ("up_mbps", "upload MB/s"),
            ("client_cpu_s_per_gib", "CPU: client s/GiB"),
            ("sink_cpu_s_per_gib", "CPU: far end s/GiB"),
        ] {
            let c = cell(&values(records, "limit", "direct", key));
            let pct = |imp: &str| {
                if !key.ends_with("mbps") {
                    return String::new();
                }
                let o = cell(&values(records, "bulk", imp, key));
                if o.n == 0 || c.n == 0 {
                    "n/a".into()
                } else {
                    format!("{:.0}%", o.med / c.med * 100.0)
                }
            };
            let _ = writeln!(
                s,
                "| {label} | {} | {} | {} |",
                fmt_cell(&c),
                pct("ours"),
                pct("go")
            );
        }
        return s;
    }
    let _ = writeln!(s, "| metric | ours | Go | ours/Go | per-round ratio range | target | met |\n|---|---|---|---|---|---|---|");
    for d in defs_for(w) {
        let o = cell(&values(records, w, "ours", d.key));
        let g = cell(&values(records, w, "go", d.key));
        if o.n == 0 && g.n == 0 {
            continue;
        }
        let (r, lo, hi) = ratio(records, w, d.key);
        let (rs, range) = if d.key == "share_pct" || d.key == "errors" {
            (String::new(), String::new())
        } else {
            (
                if r.is_finite() {
                    format!("{r:.2}x")
                } else {
                    "n/a".into()
                },
                if lo.is_finite() && hi > lo {
                    format!("{lo:.2}–{hi:.2}")
                } else if lo.is_finite() {
                    format!("{lo:.2}")
                } else {
                    String::new()
                },
            )
        };
        let (tt, mt) = if d.key == "share_pct" {
            (
                "target ≥ 90% (ours)".to_string(),
                if o.n == 0 {
                    "n/a"
                } else if o.med >= 90.0 {
                    "yes"
                } else {
                    "no"
                },
            )
        } else {
            (target_text(d), met(d, r))
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {rs} | {range} | {tt} | {mt} |",
            d.label,
            fmt_cell(&o),
            fmt_cell(&g)
        );
    }
    let _ = opts;
    s
}

fn summary_rows(records: &[Record]) -> Vec<(String, String, String, String, String, &'static str)> {
    // (what, ours, go, ratio, target, met)
    let mut rows = Vec::new();
    let idle_ws: Vec<String> = workload_names(records)
        .into_iter()
        .filter(|w| w.starts_with("idle-"))
        .collect();
    let mut items: Vec<(String, &'static MetricDef)> = vec![];
    for d in DEFS.iter().filter(|d| d.target.is_some()) {
        if d.workload == "idle" {
            for w in &idle_ws {
                items.push((w.clone(), d));
            }
        } else {
            items.push((d.workload.to_string(), d));
        }
    }
    for (w, d) in items {
        let o = cell(&values(records, &w, "ours", d.key));
        let g = cell(&values(records, &w, "go", d.key));
        if o.n == 0 && g.n == 0 {
            continue;
        }
        let (r, _, _) = ratio(records, &w, d.key);
        rows.push((
            format!("{w}: {}", d.label),
            fmt_cell(&o),
            fmt_cell(&g),
            if r.is_finite() {
                format!("{r:.2}x")
            } else {
                "n/a".into()
            },
            target_text(d),
            met(d, r),
        ));
    }
    let o = cell(&values(records, "hol", "ours", "share_pct"));
    let g = cell(&values(records, "hol", "go", "share_pct"));
    if o.n + g.n > 0 {
        rows.push((
            "hol: active throughput share %".into(),
            fmt_cell(&o),
            fmt_cell(&g),
            String::new(),
            "target ≥ 90% (ours)".into(),
            if o.n == 0 {
                "n/a"
            } else if o.med >= 90.0 {
                "yes"
            } else {
                "no"
            },
        ));
    }
    rows
}

fn summary_tables(opts: &Opts, records: &[Record]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "\n## Summary (targets and aims; ratio = ours/Go, medians)\n\n| what | ours | Go | ours/Go | target | met |\n|---|---|---|---|---|---|");
    for (a, b, c, d, e, f) in summary_rows(records) {
        let _ = writeln!(s, "| {a} | {b} | {c} | {d} | {e} | {f} |");
    }
    for w in workload_names(records) {
        let _ = writeln!(s, "\n### {}\n", title(&w, opts));
        s.push_str(&table_for(opts, records, &w));
    }
    let errs: Vec<&Record> = records.iter().filter(|r| r.error.is_some()).collect();
    let notes: Vec<&Record> = records.iter().filter(|r| !r.notes.is_empty()).collect();
    if !errs.is_empty() || !notes.is_empty() {
        let _ = writeln!(s, "\n### Failures and notes\n");
        for r in errs {
            let _ = writeln!(
                s,
                "- FAILED round {} {} {}: {}",
                r.round,
                r.workload,
                r.imp,
                r.error.as_deref().unwrap_or("").replace('\n', " ⏎ ")
            );
        }
        for r in notes {
            let _ = writeln!(
                s,
                "- note round {} {} {}: {}",
                r.round,
                r.workload,
                r.imp,
                r.notes.join("; ")
            );
        }
    }
    s
}

struct Info {
    date: String,
    cores: usize,
    cpu_model: String,
    mem: String,
    kernel: String,
    ours_version: String,
    git: String,
    rustc: String,
    upstream: String,
}

fn cmd_out(cmd: &mut Command) -> String {
    cmd.stdin(Stdio::null());
    match cmd.output() {
        Ok(o) => {
            let mut s = String::from_utf8_lossy(&o.stdout).trim().to_string();
            if s.is_empty() {
                s = String::from_utf8_lossy(&o.stderr)
                    .trim()
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string();
            }
            s
        }
        Err(e) => format!("({e})"),
    }
}

fn machine_info(opts: &Opts) -> Info {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|x| x.1.trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|k| k.parse::<f64>().ok())
        .map(|k| format!("{:.1} GiB", k / 1024.0 / 1024.0))
        .unwrap_or_else(|| "unknown".into());
    let git = {
        let d = cmd_out(
            Command::new("git")
                .args(["--no-optional-locks", "-C"])
                .arg(&opts.repo)
                .args(["describe", "--always", "--tags", "--dirty"]),
        );
        let c = cmd_out(
            Command::new("git")
                .args(["--no-optional-locks", "-C"])
                .arg(&opts.repo)
                .args(["rev-parse", "HEAD"]),
        );
        format!("{d} (commit {c})")
    };
    let upstream = std::fs::read_to_string(opts.upstream_dir.join("VERSIONS"))
        .unwrap_or_else(|_| "unknown (no VERSIONS file)".into());
    Info {
        date: jiff::Timestamp::now()
            .strftime("%Y-%m-%d %H:%M:%S UTC")
            .to_string(),
        cores: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0),
        cpu_model,
        mem,
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
            .to_string(),
        ours_version: cmd_out(Command::new(&opts.server_bin).arg("--version")),
        git,
        rustc: cmd_out(Command::new("rustc").arg("--version")),
        upstream: upstream
            .lines()
            .filter(|l| !l.contains("skew") && !l.contains("test driver"))
            .collect::<Vec<_>>()
            .join("; "),
    }
}

fn render_markdown(opts: &Opts, records: &[Record], info: &Info, total: f64) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# konnectivity-server vs upstream proxy-server: benchmarks\n"
    );
    let _ = writeln!(
        s,
        "Written by `benches/run{}` ({}; {} round(s), servers alternating, medians with (min–max); {:.0} s of benchmarks).\n",
        if opts.quick { " --quick" } else { "" },
        if opts.quick { "quick mode: small sizes, the numbers are NOT representative" } else { "full mode" },
        opts.rounds,
        total
    );
    let _ = writeln!(s, "| | |\n|---|---|");
    let _ = writeln!(s, "| date | {} |", info.date);
    let _ = writeln!(
        s,
        "| machine | {} cores ({}), {} RAM, Linux {} |",
        info.cores, info.cpu_model, info.mem, info.kernel
    );
    let _ = writeln!(s, "| ours | {} — {} |", info.ours_version, info.git);
    let _ = writeln!(s, "| rustc | {} |", info.rustc);
    let _ = writeln!(s, "| upstream | {} |", info.upstream.replace('\n', "; "));
    let _ = writeln!(s, "| agent | upstream proxy-agent (same binary and flags for both servers; --xfr-channel-size defaults) |");
    s.push_str(&summary_tables(opts, records));
    let _ = writeln!(s, "\n![ratios](ratios.png)\n");
    let _ = writeln!(s, "## How it is measured\n");
    let _ = writeln!(s, "- Both servers get the same flags: `--mode=grpc|http-connect --uds-name=<tmp>/konn.sock --server-port=0 --cluster-cert/--cluster-key/--cluster-ca-cert` (ECDSA certificates generated per run), `--agent-port/--health-port/--admin-port` from a port allocator in [1024, 32767], `--*-bind-address=127.0.0.1 --server-count=1`. Ours additionally gets `--frontend-queue-stall-timeout=2s` in the head-of-line workload only. A fresh server and agent per workload and round; the far end (source/sink) is a separate process of the bench tool.");
    let _ = writeln!(s, "- Client: tonic/hyper HTTP/2 over the UDS with adaptive flow-control windows (as grpc-go); single-use = one HTTP/2 connection + one `Proxy` stream per dial (DIAL_REQ with a random id, DIAL_RSP, DATA both ways, CLOSE_REQ, CLOSE_RSP), reusable = one connection with a stream per dial, HTTP-CONNECT = one UDS connection per dial. Uploads are sent as 32 KiB DATA packets.");
    let _ = writeln!(s, "- Data: every byte is compared with a seeded position-dependent stream (downloads by the client, uploads by the far end, which reports the first bad offset); any mismatch fails the workload.");
    let _ = writeln!(s, "- CPU: utime+stime deltas from /proc/<pid>/stat (10 ms ticks) of the server, the agent, the far end and the client (the bench process). RSS: VmHWM (bulk peak) and VmRSS (idle: RSS with all tunnels open minus RSS after a 10-tunnel warm-up, over the count). Idle CPU is measured after a {} s settle over {} s.", opts.idle_settle_secs, opts.idle_secs);
    let _ = writeln!(s, "- Dial latency: single-use from the UDS connect to DIAL_RSP (what konnectivity-client's tunnel creation costs kube-apiserver); reusable from opening the stream to DIAL_RSP; HTTP-CONNECT from the UDS connect to the 200 response.");
    let _ = writeln!(s, "- Head-of-line: {} streaming tunnels read for {} s (dials included in the window) without, then with, one tunnel that requested an endless stream and never reads (opened 1 s before the window); share = with/without.", opts.hol_active, opts.hol_secs);
    let _ = writeln!(s, "- Ratios are ours/Go of the medians; the range is of the per-round ratios (servers alternate which goes first each round). Targets are reported, not asserted.");
    s
}

fn json_escape_records(records: &[Record]) -> serde_json::Value {
    serde_json::Value::Array(
        records
            .iter()
            .map(|r| {
                serde_json::json!({
                    "workload": r.workload,
                    "impl": r.imp,
                    "round": r.round,
                    "secs": r.secs,
                    "metrics": r.metrics.iter().map(|(k, v)| (k.clone(), if v.is_finite() { serde_json::json!(v) } else { serde_json::Value::Null })).collect::<serde_json::Map<_, _>>(),
                    "error": r.error,
                    "notes": r.notes,
                })
            })
            .collect(),
    )
}

fn write_json(opts: &Opts, records: &[Record], info: &Info, total: f64) -> Result<()> {
    let v = serde_json::json!({
        "quick": opts.quick,
        "rounds": opts.rounds,
        "total_secs": total,
        "date": info.date,
        "cores": info.cores,
        "cpu": info.cpu_model,
        "memory": info.mem,
        "ours": info.ours_version,
        "git": info.git,
        "upstream": info.upstream,
        "records": json_escape_records(records),
    });
    std::fs::write(
        opts.out.join("results.json"),
        serde_json::to_string_pretty(&v)?,
    )?;
    Ok(())
}

/// For the chart: label, ours/Go ratio, higher_better, target ratio (or empty), ours, go.
fn write_ratios_csv(opts: &Opts, records: &[Record]) -> Result<()> {
    let mut s = String::from("label,ratio,higher_better,target,ours,go\n");
    let ws = workload_names(records);
    let chart: &[(&str, &str)] = &[
        ("bulk", "mbps"),
        ("bulk", "server_cpu_s_per_gib"),
        ("bulk", "peak_rss_mib"),
        ("short-single", "tunnels_per_s"),
        ("short-single", "dial_p99_ms"),
        ("short-single", "server_cpu_us_per_tunnel"),
        ("short-reusable", "tunnels_per_s"),
        ("short-reusable", "server_cpu_us_per_tunnel"),
        ("short-connect", "tunnels_per_s"),
        ("short-connect", "server_cpu_us_per_tunnel"),
        ("idle", "rss_kib_per_tunnel"),
        ("idle", "idle_cpu_ms_per_s"),
        ("hol", "share_pct"),
    ];
    for (w0, key) in chart {
        let targets: Vec<String> = if *w0 == "idle" {
            ws.iter()
                .filter(|w| w.starts_with("idle-"))
                .cloned()
                .collect()
        } else {
            vec![w0.to_string()]
        };
        for w in targets {
            if !ws.contains(&w) {
                continue;
            }
            let Some(d) = defs_for(&w).into_iter().find(|d| d.key == *key) else {
                continue;
            };
            let o = cell(&values(records, &w, "ours", key)).med;
            let g = cell(&values(records, &w, "go", key)).med;
            let (r, _, _) = ratio(records, &w, key);
            let label = format!("{w}: {}", d.label).replace(',', ";");
            let t = if *key == "share_pct" {
                "0.9".to_string()
            } else {
                d.target.map(|t| t.0.to_string()).unwrap_or_default()
            };
            let num = |v: f64| {
                if v.is_finite() {
                    format!("{v}")
                } else {
                    String::new()
                }
            };
            let _ = writeln!(
                s,
                "{label},{},{},{t},{},{}",
                num(r),
                d.higher_better,
                num(o),
                num(g)
            );
        }
    }
    std::fs::write(opts.out.join("ratios.csv"), s)?;
    Ok(())
}
