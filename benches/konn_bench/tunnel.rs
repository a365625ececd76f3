//! Client tunnels through a server: single-use or reusable gRPC, HTTP CONNECT, or direct TCP.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;

use anyhow::{anyhow, bail, Context, Result};
use bytes::{Bytes, BytesMut};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};
use tonic::Streaming;

use kube_traffic::proto::packet::Payload;
use kube_traffic::proto::proxy_service_client::ProxyServiceClient;
use kube_traffic::proto::Packet;
use kube_traffic::wire;

use crate::farend::TRAILER_SHORT;
use crate::opts::FIXED_WINDOW;
use crate::pattern::Pattern;

pub trait RawStream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> RawStream for T {}

pub struct GrpcLink {
    pub tx: Option<mpsc::Sender<Packet>>,
    pub rx: Streaming<Packet>,
    pub id: i64,
    pub closed: bool,
    // Dropped after the stream: a single-use tunnel's connection ends with it.
    pub _channel: Option<Channel>,
}

pub enum Link {
    Grpc(Box<GrpcLink>),
    Raw(Box<dyn RawStream>),
}

pub struct Tunnel {
    pub link: Link,
    pub leftover: Option<Bytes>,
    pub rbuf: BytesMut,
}

/// Upload chunk: what a TLS-record-sized writer (kubectl cp through exec) hands the client.
pub const UP_CHUNK: usize = 32 * 1024;

#[derive(Clone)]
pub enum Style {
    /// One HTTP/2 connection and one Proxy stream per dial (konnectivity-client single-use).
    Single,
    /// One shared HTTP/2 connection, one Proxy stream per dial.
    Reusable(Channel),
    /// HTTP CONNECT over the UDS (--mode=http-connect).
    Connect,
}

pub async fn uds_channel(sock: &Path) -> Result<Channel> {
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

pub async fn grpc_dial(channel: Channel, keep_channel: bool, far: SocketAddr) -> Result<Tunnel> {
    let (tx, rx) = mpsc::channel::<Packet>(16);
    let random = fastrand::i64(1..i64::MAX);
    tx.send(wire::dial_request(&far.to_string(), random))
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

pub async fn connect_dial(sock: &Path, far: SocketAddr) -> Result<Tunnel> {
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

pub async fn dial(style: &Style, sock: &Path, far: SocketAddr) -> Result<Tunnel> {
    match style {
        Style::Single => {
            let ch = uds_channel(sock).await?;
            grpc_dial(ch, true, far).await
        }
        Style::Reusable(ch) => grpc_dial(ch.clone(), false, far).await,
        Style::Connect => connect_dial(sock, far).await,
    }
}

pub async fn direct_dial(far: SocketAddr) -> Result<Tunnel> {
    let s = TcpStream::connect(far).await?;
    s.set_nodelay(true)?;
    Ok(Tunnel {
        link: Link::Raw(Box::new(s)),
        leftover: None,
        rbuf: BytesMut::new(),
    })
}

impl Tunnel {
    pub async fn send(&mut self, data: Bytes) -> Result<()> {
        match &mut self.link {
            Link::Grpc(g) => {
                let tx = g.tx.as_ref().ok_or_else(|| anyhow!("send side closed"))?;
                tx.send(wire::data(g.id, data))
                    .await
                    .map_err(|_| anyhow!("tunnel stream closed while sending"))
            }
            Link::Raw(s) => Ok(s.write_all(&data).await?),
        }
    }

    /// The next chunk of tunnel data; None at the end (CLOSE_RSP, stream end or EOF).
    pub async fn recv(&mut self) -> Result<Option<Bytes>> {
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
                        Some(Payload::CloseResponse(c)) => {
                            g.closed = true;
                            if !c.error.is_empty() {
                                bail!("tunnel closed by the server: CLOSE_RSP error: {}", c.error);
                            }
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
    pub async fn read_verify(&mut self, n: u64, p: &mut Pattern) -> Result<()> {
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

    pub async fn read_exact_vec(&mut self, n: usize) -> Result<Vec<u8>> {
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

    pub async fn send_pattern(&mut self, n: u64, p: &mut Pattern) -> Result<()> {
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
    pub async fn check_trailer(&mut self) -> Result<()> {
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
    pub async fn close(mut self) -> Result<()> {
        match &mut self.link {
            Link::Grpc(g) => {
                if !g.closed {
                    let tx = g.tx.as_ref().ok_or_else(|| anyhow!("send side closed"))?;
                    tx.send(wire::close_request(g.id))
                        .await
                        .map_err(|_| anyhow!("stream closed before CLOSE_REQ"))?;
                    loop {
                        match g.rx.message().await.context("waiting for CLOSE_RSP")? {
                            None => bail!("stream ended without CLOSE_RSP"),
                            Some(Packet {
                                payload: Some(Payload::CloseResponse(c)),
                                ..
                            }) => {
                                // The agent answers a normal close with an empty error.
                                if !c.error.is_empty() {
                                    bail!("CLOSE_RSP error: {}", c.error);
                                }
                                break;
                            }
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
