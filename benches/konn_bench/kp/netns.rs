//! Work done from inside the node's network namespaces by threads of this process (the
//! harness's `nsock::in_ns`: a thread that enters a network namespace takes only itself
//! there): the probes that see a change reach the kernel, and the data-plane load. Also the
//! sink that runs in the pods (`konn_bench kp-sink PORT`).

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, Result};

use super::harness::nsock::in_ns;

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
    let want = want.to_string();
    Ok(in_ns(ns, move || loop {
        let t = Instant::now();
        if t > deadline {
            return None;
        }
        if let Some(line) = attempt(target, connect_timeout) {
            if line.split('@').next() == Some(want.as_str()) {
                return Some(t);
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }))
}

/// Connections per second from `threads` threads in `ns` to `target` for `secs`: each one a
/// new TCP connection that reads the sink's one byte and closes with a reset (so neither side
/// nor conntrack keeps it in TIME_WAIT and the client's ports do not run out). Failed
/// connections are counted apart.
pub fn load(ns: &str, target: SocketAddr, threads: usize, secs: f64) -> Result<(f64, u64)> {
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (stop, ok, failed, ns) = (stop.clone(), ok.clone(), failed.clone(), ns.to_string());
            std::thread::spawn(move || {
                in_ns(&ns, move || {
                    let mut byte = [0u8; 8];
                    while !stop.load(Ordering::Relaxed) {
                        let mut one = || -> std::io::Result<()> {
                            let mut c =
                                TcpStream::connect_timeout(&target, Duration::from_secs(1))?;
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
                })
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().map_err(|_| anyhow!("a load thread panicked"))?;
    }
    let elapsed = t0.elapsed().as_secs_f64();
    Ok((
        ok.load(Ordering::Relaxed) as f64 / elapsed,
        failed.load(Ordering::Relaxed),
    ))
}

/// `konn_bench kp-sink PORT`: in a pod, accepts TCP connections on PORT, writes one byte and
/// closes each. Two accepting threads (the load comes from two cores at most).
pub fn sink_main(args: &[String]) -> ! {
    let port: u16 = args
        .first()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| {
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
