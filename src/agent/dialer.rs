//! Dialing a destination as Go's `net.DialTimeout` does, down to its error texts: the server
//! and its frontends (kube-apiserver, upstream's tests) read `connect: connection refused`,
//! `no such host` and `i/o timeout` out of the DIAL_RSP error, so Rust's own wording
//! (`Connection refused (os error 111)`) would break them.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::net::TcpStream;

use crate::policy::Policy;

/// A failed dial: the text upstream's agent would send, and whether it timed out (the
/// `reason` label upstream counts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DialError {
    pub text: String,
    pub timeout: bool,
    /// The destination policy's refusal (its `rule` label), when that is why.
    pub refused_by: Option<String>,
}

impl DialError {
    fn new(text: String) -> DialError {
        DialError {
            text,
            timeout: false,
            refused_by: None,
        }
    }
}

/// Go's `net.SplitHostPort`, with its error texts.
pub fn split_host_port(address: &str) -> Result<(&str, &str), String> {
    let missing = || format!("address {address}: missing port in address");
    if let Some(rest) = address.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("address {address}: missing ']' in address"))?;
        let port = after.strip_prefix(':').ok_or_else(missing)?;
        return Ok((host, port));
    }
    let (host, port) = address.rsplit_once(':').ok_or_else(missing)?;
    if host.contains(':') {
        return Err(format!("address {address}: too many colons in address"));
    }
    Ok((host, port))
}

/// An OS error as Go's `syscall.Errno.Error()` spells it: glibc's text, lower-cased first
/// letter, no "(os error N)".
fn errno_text(error: &std::io::Error) -> String {
    let text = match error.raw_os_error() {
        Some(code) => {
            let full = std::io::Error::from_raw_os_error(code).to_string();
            full.split(" (os error").next().unwrap_or(&full).to_string()
        }
        None => error.to_string(),
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => text,
    }
}

fn show(addr: SocketAddr) -> String {
    match addr.ip() {
        IpAddr::V6(ip) => format!("[{ip}]:{}", addr.port()),
        IpAddr::V4(ip) => format!("{ip}:{}", addr.port()),
    }
}

/// Dials `address` over `protocol` (`tcp`, `tcp4`, `tcp6`) within `timeout`, which covers
/// the name lookup and the connect. The stream has TCP_NODELAY and keepalive set, as Go's.
pub async fn dial(
    protocol: &str,
    address: &str,
    timeout: Duration,
    policy: &Policy,
) -> Result<TcpStream, DialError> {
    let family = match protocol {
        "tcp" => None,
        "tcp4" => Some(true),
        "tcp6" => Some(false),
        other => {
            return Err(DialError::new(format!(
                "dial {other}: unknown network {other}"
            )))
        }
    };
    let (host, port) = split_host_port(address)
        .map_err(|e| DialError::new(format!("dial {protocol} {address}: {e}")))?;
    let port: u16 = match port.parse() {
        Ok(port) => port,
        Err(_) => {
            return Err(DialError::new(format!(
                "dial {protocol}: lookup {protocol}/{port}: unknown port"
            )))
        }
    };
    let deadline = tokio::time::Instant::now() + timeout;
    let timed_out = |what: String| DialError {
        text: format!("{what}: i/o timeout"),
        timeout: true,
        refused_by: None,
    };
    let candidates: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => {
            let lookup = tokio::net::lookup_host((host, port));
            match tokio::time::timeout_at(deadline, lookup).await {
                Err(_) => return Err(timed_out(format!("dial {protocol}: lookup {host}"))),
                Ok(Err(_)) => {
                    return Err(DialError::new(format!(
                        "dial {protocol}: lookup {host}: no such host"
                    )))
                }
                Ok(Ok(addrs)) => addrs.collect(),
            }
        }
    };
    let candidates: Vec<SocketAddr> = candidates
        .into_iter()
        .filter(|a| family.is_none_or(|v4| a.is_ipv4() == v4))
        .collect();
    // The policy sees each address the name resolved to: one it refuses is never connected
    // to, even when the name also has others (a name cannot smuggle a denied address in).
    let mut refused = None;
    let candidates: Vec<SocketAddr> = candidates
        .into_iter()
        .filter(|a| match policy.check_resolved(host, a.ip(), port) {
            Ok(()) => true,
            Err(refusal) => {
                refused.get_or_insert_with(|| refusal.label().to_string());
                false
            }
        })
        .collect();
    if candidates.is_empty() {
        if let Some(rule) = refused {
            return Err(DialError {
                text: crate::policy::NOT_ALLOWED.to_string(),
                timeout: false,
                refused_by: Some(rule),
            });
        }
    }
    let mut last = None;
    for target in &candidates {
        match tokio::time::timeout_at(deadline, TcpStream::connect(target)).await {
            Err(_) => return Err(timed_out(format!("dial {protocol} {}", show(*target)))),
            Ok(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                let keepalive = socket2::TcpKeepalive::new()
                    .with_time(Duration::from_secs(15))
                    .with_interval(Duration::from_secs(15));
                let _ = socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive);
                return Ok(stream);
            }
            Ok(Err(e)) => last = Some((*target, e)),
        }
    }
    Err(match last {
        Some((target, e)) if e.kind() == std::io::ErrorKind::TimedOut => {
            timed_out(format!("dial {protocol} {}", show(target)))
        }
        Some((target, e)) => DialError::new(format!(
            "dial {protocol} {}: connect: {}",
            show(target),
            errno_text(&e)
        )),
        None => DialError::new(format!(
            "dial {protocol}: lookup {host}: no suitable address found"
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_splits_as_go() {
        assert_eq!(split_host_port("a:1"), Ok(("a", "1")));
        assert_eq!(split_host_port("[::1]:80"), Ok(("::1", "80")));
        assert_eq!(
            split_host_port("a"),
            Err("address a: missing port in address".into())
        );
        assert_eq!(
            split_host_port("::1:80"),
            Err("address ::1:80: too many colons in address".into())
        );
    }

    #[tokio::test]
    async fn errors_read_as_gos() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let err = dial(
            "tcp",
            &format!("127.0.0.1:{port}"),
            Duration::from_secs(5),
            &Policy::default(),
        )
        .await
        .unwrap_err();
        assert_eq!(
            err.text,
            format!("dial tcp 127.0.0.1:{port}: connect: connection refused")
        );
        assert!(!err.timeout);
        let err = dial(
            "udp",
            "127.0.0.1:1",
            Duration::from_secs(1),
            &Policy::default(),
        )
        .await
        .unwrap_err();
        assert_eq!(err.text, "dial udp: unknown network udp");
        let err = dial(
            "tcp",
            "no-such-host.invalid:80",
            Duration::from_secs(5),
            &Policy::default(),
        )
        .await
        .unwrap_err();
        assert!(err.text.ends_with("no such host"), "{}", err.text);
    }
}
