//! Work done from inside the node's network namespaces by threads of this process (a thread
//! that enters a network namespace with setns takes only itself there): the proxies' metrics,
//! the probes that see a change reach the kernel, and the data-plane load. Also the sink that
//! runs in the pods (`konn_bench kp-sink PORT`).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use nix::sched::{setns, CloneFlags};

/// Runs `f` on a thread of its own inside network namespace `ns` (a name under /run/netns).
pub fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> Result<T> {
    let file = std::fs::File::open(format!("/run/netns/{ns}"))
        .with_context(|| format!("network namespace {ns}"))?;
    std::thread::scope(|s| {
        s.spawn(|| {
            setns(file.as_raw_fd(), CloneFlags::CLONE_NEWNET)
                .map_err(|e| anyhow!("setns into {ns}: {e}"))?;
            Ok(f())
        })
        .join()
        .map_err(|_| anyhow!("a thread in {ns} panicked"))?
    })
}

/// `GET path` over HTTP/1.0 from inside `ns`; the body.
pub fn http_get(ns: &str, addr: SocketAddr, path: &str) -> Result<String> {
    in_netns(ns, || -> Result<String> {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        let (head, body) = text
            .split_once("\r\n\r\n")
            .ok_or_else(|| anyhow!("no HTTP header end"))?;
        if !head.starts_with("HTTP/1.") || !head.split_whitespace().nth(1).is_some_and(|c| c == "200")
        {
            return Err(anyhow!("GET {path}: {}", head.lines().next().unwrap_or("")));
        }
        Ok(body.to_string())
    })?
}

/// One attempt: the echo server's line ("pod1@side peer port") or None (refused, dropped,
/// timed out).
fn attempt(target: SocketAddr, connect_timeout: Duration) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&target, connect_timeout).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 256];
    while !buf.ends_with(b"\n") {
        match s.read(&mut chunk) {
            Ok(0) | Err(_) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
    let line = String::from_utf8_lossy(&buf).trim().to_string();
    (!line.is_empty()).then_some(line)
}

/// From inside `ns`, connects to `target` again and again (a new connection each time, so each
/// meets the rules afresh) until the answer comes from pod `want` (its name, as the echo
/// server tags its answers). Returns when the first such attempt started, or None at
/// `deadline`. `connect_timeout` bounds an attempt at an address whose packets are dropped
/// (a ClusterIP not programmed yet).
pub fn wait_answer(
    ns: &str,
    target: SocketAddr,
    want: &str,
    connect_timeout: Duration,
    deadline: Instant,
) -> Result<Option<Instant>> {
    in_netns(ns, || loop {
        let t = Instant::now();
        if t > deadline {
            return None;
        }
        if let Some(line) = attempt(target, connect_timeout) {
            if line.split('@').next() == Some(want) {
                return Some(t);
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    })
}

/// Connections per second from `threads` threads in `ns` to `target` for `secs`: each one a
/// new TCP connection that reads the sink's one byte and closes with a reset (so neither side
/// nor conntrack keeps it in TIME_WAIT and the client's ports do not run out). Failed
/// connections are counted apart.
pub fn load(ns: &str, target: SocketAddr, threads: usize, secs: f64) -> Result<(f64, u64)> {
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let file = std::fs::File::open(format!("/run/netns/{ns}"))
        .with_context(|| format!("network namespace {ns}"))?;
    let t0 = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let mut handles = Vec::new();
        for _ in 0..threads {
            let (stop, ok, failed, file) = (stop.clone(), ok.clone(), failed.clone(), &file);
            handles.push(s.spawn(move || -> Result<()> {
                setns(file.as_raw_fd(), CloneFlags::CLONE_NEWNET)
                    .map_err(|e| anyhow!("setns into {ns}: {e}"))?;
                let mut byte = [0u8; 8];
                while !stop.load(Ordering::Relaxed) {
                    let mut one = || -> std::io::Result<()> {
                        let mut c = TcpStream::connect_timeout(&target, Duration::from_secs(1))?;
                        c.set_read_timeout(Some(Duration::from_secs(1)))?;
                        while c.read(&mut byte)? > 0 {}
                        socket2::SockRef::from(&c).set_linger(Some(Duration::ZERO))?;
                        Ok(())
                    };
                    match one() {
                        Ok(()) => ok.fetch_add(1, Ordering::Relaxed),
                        Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                    };
                }
                Ok(())
            }));
        }
        std::thread::sleep(Duration::from_secs_f64(secs));
        stop.store(true, Ordering::Relaxed);
        for h in handles {
            h.join().map_err(|_| anyhow!("a load thread panicked"))??;
        }
        Ok(())
    })?;
    let elapsed = t0.elapsed().as_secs_f64();
    Ok((
        ok.load(Ordering::Relaxed) as f64 / elapsed,
        failed.load(Ordering::Relaxed),
    ))
}

/// `konn_bench kp-sink PORT`: in a pod, accepts TCP connections on PORT, writes one byte and
/// closes each. Two accepting threads (the load comes from two cores at most).
pub fn sink_main(args: &[String]) -> ! {
    let port: u16 = args.first().and_then(|p| p.parse().ok()).unwrap_or_else(|| {
        eprintln!("usage: konn_bench kp-sink PORT");
        std::process::exit(2)
    });
    let l = match TcpListener::bind(("0.0.0.0", port)) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("kp-sink: bind :{port}: {e}");
            std::process::exit(1)
        }
    };
    println!("ready");
    let _ = std::io::stdout().flush();
    let mut threads = Vec::new();
    for _ in 0..2 {
        let Ok(l) = l.try_clone() else { break };
        threads.push(std::thread::spawn(move || loop {
            if let Ok((mut c, _)) = l.accept() {
                let _ = c.write_all(b"x");
                let _ = c.shutdown(Shutdown::Write);
            }
        }));
    }
    for t in threads {
        let _ = t.join();
    }
    std::process::exit(0)
}
