//! The far end (`konn_bench farend`): a loopback TCP source/sink and its tiny request protocol.

use std::io::Write as _;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::pattern::{Pattern, UP_SEED_XOR};

pub const MAGIC: u32 = 0x4b4e_4231; // "KNB1"
pub const MODE_TRANSFER: u32 = 1; // send `down` bytes, then verify `up` bytes, then an 8-byte trailer
pub const MODE_STREAM: u32 = 2; // send the pattern until the peer goes away
pub const MODE_HOLD: u32 = 3; // send one ack byte, then wait for EOF
pub const HOLD_ACK: u8 = 0xAC;
pub const HEADER_LEN: usize = 32;
/// Trailer value when the upload ended early.
pub const TRAILER_SHORT: u64 = u64::MAX;

pub fn header(mode: u32, seed: u64, down: u64, up: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    h[4..8].copy_from_slice(&mode.to_le_bytes());
    h[8..16].copy_from_slice(&seed.to_le_bytes());
    h[16..24].copy_from_slice(&down.to_le_bytes());
    h[24..32].copy_from_slice(&up.to_le_bytes());
    h
}

pub fn farend_main() -> ! {
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

pub async fn farend_conn(mut s: TcpStream) -> Result<()> {
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

pub async fn drain(s: &mut TcpStream, buf: &mut [u8]) {
    while let Ok(n) = s.read(buf).await {
        if n == 0 {
            break;
        }
    }
}
