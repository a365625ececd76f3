//! One connection attempt to a server, as upstream's agent makes it: a fresh TCP connection
//! and TLS handshake each time (so a load balancer spreads attempts over its servers), the
//! `/AgentService/Connect` stream with the agent's metadata, and the server's id and count
//! from the response headers.

use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};
use tonic::Streaming;

use super::config::AgentConfig;
use crate::proto::Packet;

/// How long a server may take to answer the stream's headers. Upstream waits forever, and a
/// server that accepts but never answers stops its sync loop for good.
const HEADERS_TIMEOUT: Duration = Duration::from_secs(20);
/// grpc-go's TCP_USER_TIMEOUT on agent connections: unacknowledged data for this long ends
/// the connection.
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(20);
/// The agent's one method.
const CONNECT_PATH: &str = "/AgentService/Connect";
/// Packets queued toward a server on one stream, from every tunnel and the control replies.
const OUTBOUND_PACKETS: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("failed to read token {path}: {source}")]
    Token {
        path: String,
        source: std::io::Error,
    },
    #[error("header key {0:?} contains value with non-printable ASCII characters")]
    Metadata(&'static str),
    #[error("failed to connect to {address}: {cause}")]
    Transport { address: String, cause: String },
    #[error("the server refused the stream: {0}")]
    Refused(String),
    #[error("no answer from the server within {0:?}")]
    Timeout(Duration),
    #[error("expected one server ID in the context, got {0:?}")]
    ServerId(Vec<String>),
    #[error("expected one server count, got {0:?}")]
    ServerCount(Vec<String>),
    #[error("strconv.Atoi: parsing {0:?}: invalid syntax")]
    ServerCountSyntax(String),
}

/// An open stream to one server.
pub struct Connected {
    pub server_id: String,
    pub server_count: i64,
    pub inbound: Streaming<Packet>,
    pub outbound: mpsc::Sender<Packet>,
    /// Keeps the HTTP/2 connection open for as long as the stream is served.
    pub channel: Channel,
}

/// The anyhow-style chain of an error's causes, for one log line.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

fn authority(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The TCP and TLS half of an attempt, as a tonic connector.
async fn dial_server(
    host: String,
    port: u16,
    tls: Arc<rustls::ClientConfig>,
) -> std::io::Result<TokioIo<tokio_rustls::client::TlsStream<tokio::net::TcpStream>>> {
    let bare = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let tcp = tokio::net::TcpStream::connect((bare.as_str(), port)).await?;
    tcp.set_nodelay(true)?;
    let _ = socket2::SockRef::from(&tcp).set_tcp_user_timeout(Some(TCP_USER_TIMEOUT));
    let name = ServerName::try_from(bare)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await?;
    if stream.get_ref().1.alpn_protocol().is_none() {
        return Err(std::io::Error::other(
            "credentials: cannot check peer: missing selected ALPN property",
        ));
    }
    Ok(TokioIo::new(stream))
}

/// Makes one attempt. The token file is read again each time: projected tokens rotate.
pub async fn connect_once(
    config: &AgentConfig,
    tls: Arc<rustls::ClientConfig>,
) -> Result<Connected, ConnectError> {
    let token = match config.token_path() {
        Some(path) => {
            let bytes = std::fs::read(path).map_err(|source| ConnectError::Token {
                path: path.display().to_string(),
                source,
            })?;
            Some(format!("Bearer {}", String::from_utf8_lossy(&bytes)))
        }
        None => None,
    };
    let address = authority(&config.server_host, config.server_port);
    let (host, port) = (config.server_host.clone(), config.server_port);
    let connector =
        tower::service_fn(move |_: http::Uri| dial_server(host.clone(), port, tls.clone()));
    let channel = Endpoint::from_shared(format!("http://{address}"))
        .map_err(|e| ConnectError::Transport {
            address: address.clone(),
            cause: chain(&e),
        })?
        .http2_keep_alive_interval(config.keepalive)
        .keep_alive_timeout(config.keepalive_timeout)
        .keep_alive_while_idle(true)
        .http2_adaptive_window(true)
        .connect_timeout(HEADERS_TIMEOUT)
        .connect_with_connector(connector)
        .await
        .map_err(|e| ConnectError::Transport {
            address: address.clone(),
            cause: chain(&e),
        })?;
    let (outbound, rx) = mpsc::channel(OUTBOUND_PACKETS);
    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    let metadata = request.metadata_mut();
    let value = |key: &'static str, text: &str| {
        MetadataValue::try_from(text).map_err(|_| ConnectError::Metadata(key))
    };
    metadata.insert("agentid", value("agentid", &config.agent_id)?);
    metadata.insert(
        "agentidentifiers",
        value("agentidentifiers", &config.identifiers)?,
    );
    if let Some(token) = &token {
        metadata.insert("authorization", value("authorization", token)?);
    }
    let response = tokio::time::timeout(
        HEADERS_TIMEOUT,
        crate::codec::call::streaming(channel.clone(), CONNECT_PATH, request),
    )
    .await
    .map_err(|_| ConnectError::Timeout(HEADERS_TIMEOUT))?
    .map_err(|status| ConnectError::Refused(format!("{}: {}", status.code(), status.message())))?;
    let headers = response.metadata();
    let all = |key: &str| -> Vec<String> {
        headers
            .get_all(key)
            .iter()
            .map(|v| v.to_str().unwrap_or_default().to_string())
            .collect()
    };
    let ids = all("serverid");
    let [server_id] = ids.as_slice() else {
        return Err(ConnectError::ServerId(ids));
    };
    let counts = all("servercount");
    let [count] = counts.as_slice() else {
        return Err(ConnectError::ServerCount(counts));
    };
    let server_count = count
        .parse::<i64>()
        .map_err(|_| ConnectError::ServerCountSyntax(count.clone()))?;
    Ok(Connected {
        server_id: server_id.clone(),
        server_count,
        inbound: response.into_inner(),
        outbound,
        channel,
    })
}
