//! What operators read: klog-format log lines with upstream's texts, the access line per
//! tunnel, and the metrics' spelling (stream error codes, gzip).

#![allow(clippy::unwrap_used)]

mod common;

use std::io::Write as _;
use std::sync::{Arc, Mutex, OnceLock};

use common::*;
use kube_traffic::proto::{Packet, PacketType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

/// Everything logged in this test binary, in klog format at the default verbosity (4).
fn captured() -> &'static Arc<Mutex<Vec<u8>>> {
    static LOG: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        let log = Arc::new(Mutex::new(Vec::new()));
        let sink = log.clone();
        let subscriber =
            kube_traffic::logging::klog_subscriber(4, "", move || Capture(sink.clone()));
        tracing::subscriber::set_global_default(subscriber).expect("first subscriber");
        log
    })
}

struct Capture(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn log_lines() -> Vec<String> {
    let log = captured().lock().unwrap();
    String::from_utf8_lossy(&log)
        .lines()
        .map(String::from)
        .collect()
}

/// Waits for a line containing every one of `parts`, and returns it.
async fn line_with(parts: &[&str]) -> String {
    let mut found = None;
    eventually(
        "the log line",
        || {
            found = log_lines()
                .into_iter()
                .find(|l| parts.iter().all(|p| l.contains(p)));
            found.is_some()
        },
        || format!("no line with {parts:?} in:\n{}", log_lines().join("\n")),
    )
    .await;
    found.unwrap()
}

/// klog's header: `Lmmdd hh:mm:ss.uuuuuu ppppppp file:line] `.
fn assert_klog_header(line: &str, severity: char, file: &str) {
    let bytes = line.as_bytes();
    assert_eq!(bytes[0] as char, severity, "{line}");
    let digits = |range: std::ops::Range<usize>| bytes[range].iter().all(u8::is_ascii_digit);
    assert!(digits(1..5), "MMDD: {line}");
    assert_eq!(bytes[5], b' ', "{line}");
    assert!(
        digits(6..8) && digits(9..11) && digits(12..14) && digits(15..21),
        "time: {line}"
    );
    assert_eq!(
        (bytes[8], bytes[11], bytes[14]),
        (b':', b':', b'.'),
        "{line}"
    );
    assert_eq!(bytes[21], b' ', "{line}");
    let pid = format!("{:>7}", std::process::id());
    assert_eq!(&line[22..29], pid, "pid right-aligned to 7: {line}");
    assert_eq!(bytes[29], b' ', "{line}");
    let rest = &line[30..];
    let (location, message) = rest.split_once("] ").expect("file:line] ");
    let (name, number) = location.split_once(':').expect("file:line");
    assert_eq!(name, file, "{line}");
    assert!(number.parse::<u32>().is_ok(), "{line}");
    assert!(message.starts_with('"'), "quoted message: {line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_dial_without_agent_logs_upstreams_error_line_in_klog_format() {
    captured();
    let h = Harness::start().await;
    let fe = h.frontend().await;
    let mut t = fe.open().await;
    t.send(dial_req("10.9.8.7:6443", 424242)).await;
    t.recv().await;
    let received = line_with(&["\"Received DIAL_REQ\"", "dialID=424242"]).await;
    assert_klog_header(&received, 'I', "grpc.rs");
    assert!(
        received.ends_with(r#"] "Received DIAL_REQ" dialID=424242 dialAddress="10.9.8.7:6443""#),
        "{received}"
    );
    let failed = line_with(&["\"Failed to get a backend\"", "dialID=424242"]).await;
    assert_klog_header(&failed, 'E', "grpc.rs");
    assert!(
        failed.ends_with(r#"] "Failed to get a backend" err="No agent available" dialID=424242"#),
        "{failed}"
    );
    drop((t, fe));
    // The access line of a tunnel whose dial failed.
    let access = line_with(&["\"Tunnel closed\"", "dialAddress=\"10.9.8.7:6443\""]).await;
    assert!(
        access.contains("reason=\"dial failed: No agent available\""),
        "{access}"
    );
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_dial_error_is_logged_as_an_error_with_the_agents_text() {
    captured();
    let h = Harness::start().await;
    let mut agent = h.agent("agent-logs-dial-error").await;
    let fe = h.frontend().await;
    let mut t = fe.open().await;
    t.send(dial_req("127.0.0.1:1", 515151)).await;
    agent.recv().await;
    let error = "dial tcp 127.0.0.1:1: connect: connection refused";
    agent.send(dial_rsp(515151, 0, error)).await;
    t.recv().await;
    let line = line_with(&["\"DIAL_RSP contains failure\"", "dialID=515151"]).await;
    assert_klog_header(&line, 'E', "dispatch.rs");
    assert!(
        line.contains(&format!(
            r#""DIAL_RSP contains failure" err="{error}" dialID=515151 agentID="agent-logs-dial-error""#
        )),
        "{line}"
    );
    line_with(&["\"Agent connected\"", "agentID=\"agent-logs-dial-error\""]).await;
    drop((t, fe, agent));
    line_with(&[
        "\"Close backend of agent\"",
        "agentID=\"agent-logs-dial-error\"",
    ])
    .await;
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_tunnel_writes_one_access_line_with_its_bytes() {
    captured();
    let h = Harness::start().await;
    let mut agent = h.agent("agent-access").await;
    let fe = h.frontend().await;
    let mut t = fe.open().await;
    t.send(dial_req("10.1.2.3:10250", 616161)).await;
    agent.recv().await;
    agent.send(dial_rsp(616161, 61, "")).await;
    t.recv().await;
    line_with(&[
        "\"Proxy connection established\"",
        "dialID=616161",
        "connectionID=61",
        "dialAddress=\"10.1.2.3:10250\"",
        "dialDuration=",
    ])
    .await;
    t.send(data(61, &b"12345"[..])).await;
    agent.recv().await;
    agent.send(data(61, &b"1234567890"[..])).await;
    t.recv().await;
    // The agent closes the connection; the client then ends its stream.
    agent.send(close_rsp(61, "")).await;
    assert_eq!(t.recv().await, close_rsp(61, ""));
    t.close_send();
    t.recv_end().await.expect("clean end");
    let line = line_with(&["\"Tunnel closed\"", "agentID=\"agent-access\""]).await;
    assert_klog_header(&line, 'I', "mod.rs");
    for field in [
        "frontend=\"grpc\"",
        "dialAddress=\"10.1.2.3:10250\"",
        "connectionID=61",
        "bytesToAgent=5",
        "bytesFromAgent=10",
        "duration=\"",
        "reason=\"agent closed\"",
    ] {
        assert!(line.contains(field), "{field} in {line}");
    }
    drop((t, fe, agent));
    h.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_connect_tunnel_logs_and_counts_only_agent_segments() {
    captured();
    let h = Harness::start_with(&["--mode=http-connect"]).await;
    let mut agent = h.agent("agent-http").await;
    let mut client = UnixStream::connect(&h.uds).await.unwrap();
    client
        .write_all(b"CONNECT 10.4.4.4:443 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let Some(kube_traffic::proto::packet::Payload::DialRequest(req)) = agent.recv().await.payload
    else {
        panic!("a DIAL_REQ")
    };
    agent.send(dial_rsp(req.random, 3, "")).await;
    let mut head = [0u8; 39];
    within("the 200", client.read_exact(&mut head))
        .await
        .unwrap();
    assert_eq!(&head, b"HTTP/1.1 200 Connection Established\r\n\r\n");
    client.write_all(b"ping").await.unwrap();
    assert_eq!(agent.recv().await, data(3, &b"ping"[..]));
    agent.send(data(3, &b"pong!"[..])).await;
    let mut pong = [0u8; 5];
    within("the reply", client.read_exact(&mut pong))
        .await
        .unwrap();
    drop(client);
    assert_eq!(agent.recv().await, close_req(3));
    line_with(&[
        "\"Received request for host\"",
        "method=\"CONNECT\"",
        "host=\"10.4.4.4:443\"",
    ])
    .await;
    line_with(&[
        "\"Connection established, sent 200 OK\"",
        "host=\"10.4.4.4:443\"",
        "connectionID=3",
    ])
    .await;
    let line = line_with(&["\"Tunnel closed\"", "agentID=\"agent-http\""]).await;
    for field in [
        "frontend=\"http-connect\"",
        "bytesToAgent=4",
        "bytesFromAgent=5",
        "reason=\"client closed\"",
    ] {
        assert!(line.contains(field), "{field} in {line}");
    }
    // Upstream counts HTTP-CONNECT packets on the agent segments only.
    let text = h.metrics().render();
    let count = |segment: &str, kind: &str| {
        let series = format!(
            "konnectivity_network_proxy_server_stream_packets_total{{packet_type=\"{kind}\",segment=\"{segment}\"}} "
        );
        text.lines()
            .find_map(|l| l.strip_prefix(&series))
            .map_or(0, |v| v.parse::<u64>().unwrap())
    };
    assert_eq!(count("to_agent", "DIAL_REQ"), 1);
    assert_eq!(count("from_agent", "DIAL_RSP"), 1);
    assert_eq!(count("to_agent", "DATA"), 1);
    assert_eq!(count("from_agent", "DATA"), 1);
    assert!(!text.contains("segment=\"to_client\""), "{text}");
    assert!(!text.contains("segment=\"from_client\""), "{text}");
    drop(agent);
    h.finish().await;
}

/// A frontend whose socket the test can cut, as a crashed or restarted kube-apiserver's is.
async fn cuttable_frontend(
    uds: &std::path::Path,
) -> (
    kube_traffic::proto::proxy_service_client::ProxyServiceClient<tonic::transport::Channel>,
    Arc<Mutex<Vec<std::os::unix::net::UnixStream>>>,
) {
    let sockets = Arc::new(Mutex::new(Vec::new()));
    let kept = sockets.clone();
    let path = uds.to_path_buf();
    let connector = tower::service_fn(move |_: http::Uri| {
        let path = path.clone();
        let kept = kept.clone();
        async move {
            let std_stream = std::os::unix::net::UnixStream::connect(&path)?;
            kept.lock().unwrap().push(std_stream.try_clone()?);
            std_stream.set_nonblocking(true)?;
            let stream = UnixStream::from_std(std_stream)?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
        }
    });
    let channel = tonic::transport::Endpoint::from_static("http://localhost")
        .connect_with_connector(connector)
        .await
        .unwrap();
    (
        kube_traffic::proto::proxy_service_client::ProxyServiceClient::new(channel),
        sockets,
    )
}

/// A client whose connection goes away mid-stream is `Canceled`, as grpc-go counts it, not
/// `Unknown`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_whose_connection_dies_counts_as_canceled() {
    captured();
    let h = Harness::start().await;
    let mut agent = h.agent("agent-cancel").await;
    let (client, sockets) = cuttable_frontend(&h.uds).await;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    // Queued before the call: the response headers come with the DIAL_RSP.
    tx.send(dial_req("10.7.7.7:443", 717171)).await.unwrap();
    let mut caller = client.clone();
    let call = tokio::spawn(async move {
        caller
            .proxy(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
    });
    assert_eq!(agent.recv().await, dial_req("10.7.7.7:443", 717171));
    agent.send(dial_rsp(717171, 71, "")).await;
    let mut inbound = call.await.unwrap().unwrap().into_inner();
    assert_eq!(
        inbound.message().await.unwrap(),
        Some(dial_rsp(717171, 71, ""))
    );
    // The client's socket is cut: no END_STREAM, no RST_STREAM.
    for socket in sockets.lock().unwrap().iter() {
        socket.shutdown(std::net::Shutdown::Both).unwrap();
    }
    assert_eq!(agent.recv().await, close_req(71));
    let text = h.metrics().render();
    assert!(
        text.contains(
            "konnectivity_network_proxy_server_stream_errors_total{code=\"Canceled\",packet_type=\"Unknown\",segment=\"from_client\"} 1"
        ),
        "{text}"
    );
    assert!(!text.contains("code=\"Unknown\""), "{text}");
    line_with(&["\"Stream read from frontend cancelled\""]).await;
    drop((tx, inbound, client, agent));
    h.finish().await;
}

/// One raw HTTP/1.1 request; returns the raw response bytes.
async fn raw_get(addr: std::net::SocketAddr, headers: &str) -> Vec<u8> {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request =
        format!("GET /metrics HTTP/1.1\r\nHost: localhost\r\n{headers}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    within("the response", stream.read_to_end(&mut response))
        .await
        .unwrap();
    response
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_gzipped_when_the_scraper_accepts_gzip() {
    let h = Harness::start().await;
    for addr in [h.health_addr, h.admin_addr] {
        let response = raw_get(addr, "Accept-Encoding: gzip\r\n").await;
        let split = response.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        let head = String::from_utf8_lossy(&response[..split]).to_ascii_lowercase();
        assert!(head.contains("content-encoding: gzip"), "{head}");
        let mut body = Vec::new();
        std::io::Read::read_to_end(
            &mut flate2::read::GzDecoder::new(&response[split + 4..]),
            &mut body,
        )
        .expect("a gzip body");
        let body = String::from_utf8(body).unwrap();
        assert!(body
            .contains("# TYPE konnectivity_network_proxy_server_dial_duration_seconds histogram"));
        assert!(body.contains("le=\"1e-06\""), "Go's spelling of 1e-6");

        let plain = raw_get(addr, "").await;
        let text = String::from_utf8_lossy(&plain);
        assert!(
            !text.to_ascii_lowercase().contains("content-encoding"),
            "{text}"
        );
        assert!(text.contains("le=\"1e-05\""));
    }
    let _ = std::io::stderr().flush();
    h.finish().await;
}

#[allow(dead_code)]
fn unused(_: Packet, _: PacketType) {}
