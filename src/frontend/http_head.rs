//! The request head of an HTTP-CONNECT connection, read the way Go's http.Server reads one,
//! up to what upstream's handler sees: its method, its host (Go's `r.Host`) and user agent,
//! whether the client asked to close, and the body to skip before the next request. What Go
//! refuses is refused with the bytes Go answers with.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Go's http.Server ReadHeaderTimeout in upstream.
const HEADER_TIMEOUT: Duration = Duration::from_secs(60);
/// Go's DefaultMaxHeaderBytes.
const MAX_HEADER_BYTES: usize = 1 << 20;
/// A parsed request head, and any bytes the client sent after it.
#[derive(Debug)]
pub(super) struct Head {
    pub(super) method: String,
    /// What Go's `r.Host` holds: the request-target's authority (CONNECT), else the Host header.
    pub(super) host: String,
    pub(super) user_agent: String,
    /// The client asked to close after this request (`Connection: close`, or HTTP/1.0 without
    /// keep-alive).
    pub(super) close: bool,
    /// `Content-Length` of a request body, to be skipped before the next request; `None` for a
    /// body we cannot skip (chunked, or too large), after which the connection is closed.
    pub(super) body: Option<u64>,
    pub(super) rest: Bytes,
}

/// Why a request head was refused, each with Go's http.Server bytes.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum HeadError {
    Closed,
    /// Over Go's read limit (431).
    TooLarge,
    /// Go's plain `400 Bad Request`.
    Malformed,
    /// Go's `400 Bad Request: <text>`.
    BadRequest(&'static str),
    /// Not HTTP/1.x (505).
    Version,
    TimedOut,
}

impl HeadError {
    pub(super) fn response(&self) -> Option<Vec<u8>> {
        const HEADERS: &str =
            "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n";
        let public = match self {
            HeadError::Closed | HeadError::TimedOut => return None,
            HeadError::TooLarge => "431 Request Header Fields Too Large".to_string(),
            HeadError::Malformed => "400 Bad Request".to_string(),
            HeadError::BadRequest(text) => format!("400 Bad Request: {text}"),
            HeadError::Version => {
                "505 HTTP Version Not Supported: unsupported protocol version".to_string()
            }
        };
        Some(format!("HTTP/1.1 {public}{HEADERS}{public}").into_bytes())
    }
}

/// Go's http.Server reads at most MaxHeaderBytes plus 4 KiB of bufio slack for a request head.
const HEAD_READ_LIMIT: usize = MAX_HEADER_BYTES + 4096;
/// Go discards up to 256 KiB of an unread request body to keep the connection.
const MAX_SKIPPED_BODY: u64 = 256 << 10;

/// Where the head ends (after its blank line), if it is complete: lines end in LF or CRLF.
fn head_end(buf: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    while let Some(i) = buf[at..].iter().position(|&b| b == b'\n') {
        let nl = at + i;
        let blank = (nl >= 1 && buf[nl - 1] == b'\n')
            || (nl >= 2 && buf[nl - 1] == b'\r' && buf[nl - 2] == b'\n');
        if blank {
            return Some(nl + 1);
        }
        at = nl + 1;
    }
    None
}

/// An HTTP token (method, header name), as Go checks them.
fn is_token(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Go's `http.ParseHTTPVersion`.
fn parse_version(proto: &str) -> Option<(u32, u32)> {
    let (major, minor) = proto.strip_prefix("HTTP/")?.split_once('.')?;
    let digits = |s: &str| {
        (!s.is_empty() && s.len() <= 3 && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    Some((digits(major)?, digits(minor)?))
}

/// Whether Go's `url.ParseRequestURI` takes a non-CONNECT request-target: `*`, a path, or an
/// absolute URL.
fn request_uri_ok(target: &str) -> bool {
    if target == "*" || target.starts_with('/') {
        return true;
    }
    match target.split_once(':') {
        Some((scheme, _)) => {
            scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
        }
        None => false,
    }
}

/// Parses a complete head the way Go's http.Server reads one, up to what the handler sees.
fn parse_head(head: &[u8]) -> Result<Head, HeadError> {
    let text = std::str::from_utf8(head).map_err(|_| HeadError::Malformed)?;
    let mut lines = text.split('\n').map(|l| l.strip_suffix('\r').unwrap_or(l));
    let request_line = lines.next().unwrap_or_default();
    let (method, rest) = request_line.split_once(' ').ok_or(HeadError::Malformed)?;
    let (target, proto) = rest.split_once(' ').ok_or(HeadError::Malformed)?;
    if !is_token(method) {
        return Err(HeadError::Malformed);
    }
    let (major, minor) = parse_version(proto).ok_or(HeadError::Malformed)?;
    let authority = method == "CONNECT" && !target.starts_with('/');
    if !authority && !request_uri_ok(target) {
        return Err(HeadError::Malformed);
    }
    let mut host_headers = Vec::new();
    let mut user_agent = String::new();
    let mut connection = Vec::new();
    let mut content_length: Option<u64> = None;
    let mut chunked = false;
    for line in lines.take_while(|l| !l.is_empty()) {
        let (name, value) = line.split_once(':').ok_or(HeadError::Malformed)?;
        if !is_token(name) {
            return Err(HeadError::Malformed);
        }
        let value = value.trim_matches([' ', '\t']);
        match name.to_ascii_lowercase().as_str() {
            "host" => host_headers.push(value.to_string()),
            "user-agent" => user_agent = value.to_string(),
            "connection" => {
                connection.extend(value.split(',').map(|t| t.trim().to_ascii_lowercase()))
            }
            "content-length" => {
                content_length = Some(value.parse().map_err(|_| HeadError::Malformed)?)
            }
            "transfer-encoding" => chunked = true,
            _ => {}
        }
    }
    // Go checks the version first, then the Host header's presence, then its count.
    let pri = major == 2 && minor == 0 && method == "PRI" && target == "*";
    if major != 1 && !pri {
        return Err(HeadError::Version);
    }
    if (major, minor) >= (1, 1) && host_headers.is_empty() && method != "CONNECT" {
        return Err(HeadError::BadRequest("missing required Host header"));
    }
    if host_headers.len() > 1 {
        return Err(HeadError::BadRequest("too many Host headers"));
    }
    let host = if authority {
        // Go parses "http://" + target and takes its host (userinfo and path dropped).
        let after_userinfo = target.rsplit_once('@').map_or(target, |(_, h)| h);
        after_userinfo
            .split(['/', '?', '#'])
            .next()
            .unwrap_or_default()
            .to_string()
    } else {
        String::new()
    };
    let host = if host.is_empty() {
        host_headers.into_iter().next().unwrap_or_default()
    } else {
        host
    };
    let close = connection.iter().any(|t| t == "close")
        || ((major, minor) < (1, 1) && !connection.iter().any(|t| t == "keep-alive"));
    let body = match (chunked, content_length) {
        (true, _) => None,
        (false, Some(n)) if n > MAX_SKIPPED_BODY => None,
        (false, n) => Some(n.unwrap_or(0)),
    };
    Ok(Head {
        method: method.to_string(),
        host,
        user_agent,
        close,
        body,
        rest: Bytes::new(),
    })
}

/// Reads one request head, starting with what `buf` already holds.
pub(super) async fn read_head<S: AsyncRead + Unpin>(
    stream: &mut S,
    mut buf: BytesMut,
) -> Result<Head, HeadError> {
    let read = async {
        let mut scanned = 0;
        loop {
            if let Some(len) = head_end(&buf, scanned) {
                if len > HEAD_READ_LIMIT {
                    return Err(HeadError::TooLarge);
                }
                let head = parse_head(&buf[..len])?;
                // Copied out (usually nothing: a CONNECT client waits for the 200), so the
                // head's buffer is freed here rather than held by the tunnel for its life.
                let rest = Bytes::copy_from_slice(&buf[len..]);
                return Ok(Head { rest, ..head });
            }
            if buf.len() >= HEAD_READ_LIMIT {
                return Err(HeadError::TooLarge);
            }
            scanned = buf.len().saturating_sub(2);
            buf.reserve(4096);
            if stream
                .read_buf(&mut buf)
                .await
                .map_err(|_| HeadError::Closed)?
                == 0
            {
                return Err(HeadError::Closed);
            }
        }
    };
    tokio::time::timeout(HEADER_TIMEOUT, read)
        .await
        .unwrap_or(Err(HeadError::TimedOut))
}

/// Reads and drops `n` body bytes after `rest`; returns what follows them.
pub(super) async fn skip_body<S: AsyncRead + Unpin>(
    stream: &mut S,
    rest: Bytes,
    mut n: u64,
) -> Option<BytesMut> {
    let mut buf = BytesMut::from(&rest[..]);
    loop {
        let take = n.min(buf.len() as u64) as usize;
        let _ = buf.split_to(take);
        n -= take as u64;
        if n == 0 {
            return Some(buf);
        }
        if stream.read_buf(&mut buf).await.ok()? == 0 {
            return None;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// What a head came to: what the handler would see, or the bytes Go answers with.
    #[derive(Debug, PartialEq, Eq)]
    enum Seen {
        /// Method, host (`r.Host`), close after this request, body to skip.
        Handler(&'static str, &'static str, bool, Option<u64>),
        Refused(HeadError),
    }
    use Seen::*;

    fn seen(head: &str) -> Result<(String, String, bool, Option<u64>), HeadError> {
        parse_head(head.as_bytes()).map(|h| (h.method, h.host, h.close, h.body))
    }

    /// Cases from Go's documented http.Server behaviour: the request line is `METHOD SP
    /// target SP HTTP/x.y` with a token method and a case-sensitive version; HTTP/1.1 needs
    /// one Host header unless the method is CONNECT, whose authority-form target is `r.Host`;
    /// other major versions get 505; header names are tokens (no space before the colon);
    /// values are trimmed; bare LF ends lines as CRLF does.
    #[test]
    fn heads_are_taken_and_refused_as_gos_server_does() {
        let bad = |text| Refused(HeadError::BadRequest(text));
        let cases: &[(&str, Seen)] = &[
            // CONNECT: the target is the host; no Host header needed, a Host header ignored.
            (
                "CONNECT 10.0.0.1:443 HTTP/1.1\r\n\r\n",
                Handler("CONNECT", "10.0.0.1:443", false, Some(0)),
            ),
            (
                "CONNECT a.example:443 HTTP/1.1\r\nHost: other:1\r\n\r\n",
                Handler("CONNECT", "a.example:443", false, Some(0)),
            ),
            (
                "CONNECT user@a.example:443 HTTP/1.1\r\n\r\n",
                Handler("CONNECT", "a.example:443", false, Some(0)),
            ),
            (
                "CONNECT [::1]:443 HTTP/1.1\r\n\r\n",
                Handler("CONNECT", "[::1]:443", false, Some(0)),
            ),
            // A path target is not an authority: r.Host comes from the Host header.
            (
                "CONNECT /x HTTP/1.1\r\nHost: h:1\r\n\r\n",
                Handler("CONNECT", "h:1", false, Some(0)),
            ),
            // Bare LF line ends, and values trimmed of spaces and tabs.
            (
                "CONNECT h:1 HTTP/1.1\nUser-Agent: \t x \t\n\n",
                Handler("CONNECT", "h:1", false, Some(0)),
            ),
            // HTTP/1.0: closes unless keep-alive; no Host header needed for any method.
            (
                "CONNECT h:1 HTTP/1.0\r\n\r\n",
                Handler("CONNECT", "h:1", true, Some(0)),
            ),
            ("GET / HTTP/1.0\r\n\r\n", Handler("GET", "", true, Some(0))),
            (
                "GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n",
                Handler("GET", "", false, Some(0)),
            ),
            (
                "GET / HTTP/1.1\r\nHost: h\r\nConnection: foo, close\r\n\r\n",
                Handler("GET", "h", true, Some(0)),
            ),
            // Methods are case-sensitive tokens: `connect` is another method (405 later).
            (
                "connect h:1 HTTP/1.1\r\nHost: h:1\r\n\r\n",
                Handler("connect", "h:1", false, Some(0)),
            ),
            (
                "connect h:1 HTTP/1.1\r\n\r\n",
                bad("missing required Host header"),
            ),
            (
                "GET / HTTP/1.1\r\n\r\n",
                bad("missing required Host header"),
            ),
            (
                "GET / HTTP/1.1\r\nhOsT: h\r\n\r\n",
                Handler("GET", "h", false, Some(0)),
            ),
            (
                "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
                bad("too many Host headers"),
            ),
            (
                "CONNECT h:1 HTTP/1.1\r\nHost: a\r\nhost: a\r\n\r\n",
                bad("too many Host headers"),
            ),
            // Bodies: skipped when small and sized; not when chunked or too large.
            (
                "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\n",
                Handler("POST", "h", false, Some(5)),
            ),
            (
                "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 300000\r\n\r\n",
                Handler("POST", "h", false, None),
            ),
            (
                "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n",
                Handler("POST", "h", false, None),
            ),
            (
                "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: five\r\n\r\n",
                Refused(HeadError::Malformed),
            ),
            // A malformed request line is a plain 400.
            ("CONNECT h:1\r\n\r\n", Refused(HeadError::Malformed)),
            ("CONNECT HTTP/1.1\r\n\r\n", Refused(HeadError::Malformed)),
            (
                "CONNECT  h:1 HTTP/1.1\r\n\r\n",
                Refused(HeadError::Malformed),
            ),
            (
                "CONN(ECT h:1 HTTP/1.1\r\n\r\n",
                Refused(HeadError::Malformed),
            ),
            (
                " CONNECT h:1 HTTP/1.1\r\n\r\n",
                Refused(HeadError::Malformed),
            ),
            (
                "CONNECT h:1 http/1.1\r\n\r\n",
                Refused(HeadError::Malformed),
            ),
            ("CONNECT h:1 HTTP/1\r\n\r\n", Refused(HeadError::Malformed)),
            (
                "CONNECT h:1 HTTP/1.1.1\r\n\r\n",
                Refused(HeadError::Malformed),
            ),
            (
                "GET nohost HTTP/1.1\r\nHost: h\r\n\r\n",
                Refused(HeadError::Malformed),
            ),
            // Header lines: a name is a token, and a line needs its colon.
            (
                "CONNECT h:1 HTTP/1.1\r\nHost : h\r\n\r\n",
                Refused(HeadError::Malformed),
            ),
            (
                "CONNECT h:1 HTTP/1.1\r\nno colon\r\n\r\n",
                Refused(HeadError::Malformed),
            ),
            // Other major versions: 505, after the request line and headers parsed.
            ("CONNECT h:1 HTTP/2.0\r\n\r\n", Refused(HeadError::Version)),
            ("GET / HTTP/0.9\r\n\r\n", Refused(HeadError::Version)),
            (
                "GET / HTTP/3.0\r\nHost: a\r\nHost: b\r\n\r\n",
                Refused(HeadError::Version),
            ),
        ];
        for (head, want) in cases {
            let got = match seen(head) {
                Ok((method, host, close, body)) => {
                    assert_eq!(
                        *want,
                        Handler(method.leak(), host.leak(), close, body),
                        "{head:?}"
                    );
                    continue;
                }
                Err(e) => Refused(e),
            };
            assert_eq!(got, *want, "{head:?}");
        }
    }

    #[test]
    fn refusals_are_gos_bytes() {
        let head = "HTTP/1.1 400 Bad Request: missing required Host header\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request: missing required Host header";
        assert_eq!(
            HeadError::BadRequest("missing required Host header").response(),
            Some(head.as_bytes().to_vec())
        );
        let too_large = HeadError::TooLarge.response().unwrap();
        assert!(too_large.starts_with(b"HTTP/1.1 431 Request Header Fields Too Large\r\n"));
        assert!(too_large.ends_with(b"\r\n\r\n431 Request Header Fields Too Large"));
        let version = HeadError::Version.response().unwrap();
        assert!(version.starts_with(
            b"HTTP/1.1 505 HTTP Version Not Supported: unsupported protocol version\r\n"
        ));
        assert_eq!(HeadError::Closed.response(), None);
        assert_eq!(HeadError::TimedOut.response(), None);
    }

    #[tokio::test]
    async fn a_head_past_gos_read_limit_is_too_large() {
        let long = format!(
            "CONNECT h:1 HTTP/1.1\r\nX-Long: {}\r\n\r\n",
            "a".repeat(HEAD_READ_LIMIT)
        );
        let got = read_head(&mut long.as_bytes(), BytesMut::new()).await;
        assert_eq!(got.unwrap_err(), HeadError::TooLarge);
        // Just under the limit is read, and what follows the head is kept for the tunnel.
        let fits = format!(
            "CONNECT h:1 HTTP/1.1\r\nX-Long: {}\r\n\r\nearly",
            "a".repeat(MAX_HEADER_BYTES)
        );
        let head = read_head(&mut fits.as_bytes(), BytesMut::new())
            .await
            .unwrap();
        assert_eq!(head.host, "h:1");
        assert_eq!(&head.rest[..], b"early");
    }

    #[tokio::test]
    async fn a_head_cut_short_is_a_closed_connection() {
        let got = read_head(
            &mut &b"CONNECT h:1 HTTP/1.1\r\nHost: h"[..],
            BytesMut::new(),
        )
        .await;
        assert_eq!(got.unwrap_err(), HeadError::Closed);
    }

    #[tokio::test]
    async fn a_skipped_body_leaves_the_next_request() {
        let mut rest = &b"lo\r\nGET / HTTP/1.1\r\n"[..];
        let next = skip_body(&mut rest, Bytes::from_static(b"hel"), 5)
            .await
            .unwrap();
        assert_eq!(&next[..], b"\r\nGET / HTTP/1.1\r\n");
        assert!(skip_body(&mut &b""[..], Bytes::new(), 1).await.is_none());
    }
}
