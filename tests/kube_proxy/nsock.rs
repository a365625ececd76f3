//! Sockets of the test process itself inside a node's namespaces: a socket belongs to the
//! network namespace it was created in, whichever thread uses it later. So a short-lived
//! thread enters the namespace, creates the socket and hands it back; the test then holds a
//! UDP flow with a fixed source port, or one TCP connection, across changes to the proxy, and
//! reads the proxy's healthz and metrics ports, with no helper process in between. The
//! test's own threads never leave the host's namespace.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::Duration;

use nix::sched::{setns, CloneFlags};

/// Runs `f` on a thread inside network namespace `ns` (a name from `ip netns`).
pub fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        setns(file.as_raw_fd(), CloneFlags::CLONE_NEWNET).expect("setns");
        f()
    })
    .join()
    .expect("thread in the namespace")
}

/// A UDP socket in `ns` bound to `local` (a fixed source port makes one conntrack flow),
/// connected to `peer`, with a read timeout.
pub fn udp_flow(ns: &str, local: SocketAddr, peer: SocketAddr) -> UdpSocket {
    in_ns(ns, move || {
        let s = UdpSocket::bind(local).unwrap_or_else(|e| panic!("bind {local}: {e}"));
        s.connect(peer).expect("connect");
        s.set_read_timeout(Some(Duration::from_millis(1500)))
            .expect("timeout");
        s
    })
}

/// Sends one datagram on `s` and returns the first word of the answer (the echo server's
/// name, `pod1@rs`), or "TIMEOUT"/"ERROR ...". A lost datagram is retried: UDP through a
/// NAT that is being reprogrammed may drop one, and what matters is who answers.
pub fn udp_ask(s: &UdpSocket) -> String {
    let mut last = String::new();
    for _ in 0..3 {
        if let Err(e) = s.send(b"hello\n") {
            last = format!("ERROR {e}");
            continue;
        }
        let mut buf = [0u8; 512];
        match s.recv(&mut buf) {
            Ok(n) => {
                let text = String::from_utf8_lossy(&buf[..n]);
                return text
                    .split_whitespace()
                    .next()
                    .unwrap_or("EMPTY")
                    .to_string();
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                last = "TIMEOUT".into();
            }
            Err(e) => last = format!("ERROR {e}"),
        }
    }
    last
}

/// One TCP connection from `ns` to the line echo (netagent's LINE_PORT) behind `peer`.
pub struct LineConn {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
    /// The first answer's first word: who holds the other end.
    pub server: String,
}

impl LineConn {
    pub fn open(ns: &str, peer: SocketAddr) -> Result<LineConn, String> {
        let stream = in_ns(ns, move || {
            TcpStream::connect_timeout(&peer, Duration::from_secs(3))
                .map_err(|e| format!("connect {peer}: {e}"))
        })?;
        stream
            .set_read_timeout(Some(Duration::from_secs(3)))
            .map_err(|e| e.to_string())?;
        let reader = BufReader::new(stream.try_clone().map_err(|e| e.to_string())?);
        let mut c = LineConn {
            stream,
            reader,
            server: String::new(),
        };
        let first = c.ask("hello")?;
        c.server = first.split_whitespace().next().unwrap_or("").to_string();
        Ok(c)
    }

    /// Sends `line` and reads the echo's answer ("pod1@rs 10.244.1.1 line").
    pub fn ask(&mut self, line: &str) -> Result<String, String> {
        self.stream
            .write_all(format!("{line}\n").as_bytes())
            .map_err(|e| format!("send {line:?}: {e}"))?;
        let mut answer = String::new();
        match self.reader.read_line(&mut answer) {
            Ok(0) => Err(format!("connection closed before answering {line:?}")),
            Ok(_) if answer.trim_end().ends_with(line) => Ok(answer.trim_end().to_string()),
            Ok(_) => Err(format!("answer {answer:?} to {line:?}")),
            Err(e) => Err(format!("no answer to {line:?}: {e}")),
        }
    }
}

/// An HTTP/1.0 GET from `ns` to `addr`: the status and the body.
pub fn http_get(ns: &str, addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let path = path.to_string();
    in_ns(ns, move || {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
            .map_err(|e| format!("connect {addr}: {e}"))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(|e| e.to_string())?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .map_err(|e| e.to_string())?;
        let mut raw = Vec::new();
        s.read_to_end(&mut raw)
            .map_err(|e| format!("GET {addr}{path}: {e}"))?;
        let text = String::from_utf8_lossy(&raw).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let code = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| format!("GET {addr}{path}: no status line in {head:?}"))?;
        Ok((code, body.to_string()))
    })
}

/// The value of the sample `series` (name and labels exactly as exposed, e.g.
/// `kubeproxy_sync_proxy_rules_nftables_sync_failures_total{ip_family="IPv4"}`), or None.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (name, value) = l.rsplit_once(' ')?;
        (name == series).then(|| value.parse().ok())?
    })
}
