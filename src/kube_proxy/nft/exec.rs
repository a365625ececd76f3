//! The kernel's side. A transaction is applied whole or refused whole, by one of two
//! `Applier`s: nf_tables netlink messages written by the proxy (`netlink`, the default), or
//! `nft -f -` with the rendered text (kept for tests, diffs and `trace`, and as a fallback:
//! `KUBE_PROXY_NFT_APPLIER=nft`). `nft -j list table` shows what a family's table holds.
//! Through nft, the transaction is written to its stdin as it is rendered, a piece at a
//! time, so a large one is never held as text.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use super::netlink::{Netlink, NetlinkError};
use super::objects::{render_op, Transaction, TABLE};
use crate::kube_proxy::model::IpFamily;

/// How much rendered text is written to nft at a time.
const CHUNK: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum NftError {
    #[error("cannot run {path}: {source}")]
    Spawn {
        path: String,
        source: std::io::Error,
    },
    #[error("nft refused the transaction ({status}): {stderr}")]
    Refused { status: String, stderr: String },
    #[error("nft {0} is too old: 1.0.1 or later is needed")]
    TooOld(String),
    #[error("writing to nft: {0}")]
    Write(std::io::Error),
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    #[error("{APPLIER_ENV}={0:?}: the applier is `netlink` or `nft`")]
    UnknownApplier(String),
}

impl NftError {
    /// A label for the failure counters.
    pub fn kind(&self) -> &'static str {
        match self {
            NftError::Spawn { .. } => "spawn",
            NftError::Refused { .. } => "refused",
            NftError::TooOld(_) => "version",
            NftError::Write(_) => "write",
            NftError::Netlink(e) => e.kind(),
            NftError::UnknownApplier(_) => "config",
        }
    }

    /// Whether the table (or another object named) was not there.
    pub fn is_not_found(&self) -> bool {
        match self {
            NftError::Refused { stderr, .. } => stderr.contains("No such file or directory"),
            NftError::Netlink(e) => e.errno() == Some(libc::ENOENT),
            _ => false,
        }
    }
}

/// The environment variable that chooses how transactions reach the kernel: `netlink` (the
/// default) or `nft`.
pub const APPLIER_ENV: &str = "KUBE_PROXY_NFT_APPLIER";

/// How the proxy applies its transactions.
#[derive(Clone, Debug)]
pub enum Applier {
    /// nf_tables netlink messages, the same objects nft would create from the text.
    Netlink(Netlink),
    /// `nft -f -` with the rendered text.
    Nft(Nft),
}

impl Applier {
    /// The applier `KUBE_PROXY_NFT_APPLIER` names (netlink when unset), checked: the kernel
    /// must take an (empty) nf_tables batch, or `nft` must be found and recent enough. The
    /// netlink socket belongs to the calling thread's network namespace.
    pub async fn from_env() -> Result<Applier, NftError> {
        let chosen = std::env::var(APPLIER_ENV).unwrap_or_default();
        let applier = match chosen.trim() {
            "" | "netlink" => {
                let netlink = Netlink::open()?;
                // An empty batch: the kernel refuses it whole when it has no nf_tables.
                netlink.apply(&Transaction::new(IpFamily::V4)).await?;
                Applier::Netlink(netlink)
            }
            "nft" => Applier::Nft(Nft::find(None).await?),
            other => return Err(NftError::UnknownApplier(other.to_owned())),
        };
        tracing::info!(
            applier = applier.name(),
            "nftables transactions are applied with {}",
            applier.name()
        );
        Ok(applier)
    }

    pub fn name(&self) -> &'static str {
        match self {
            Applier::Netlink(_) => "netlink",
            Applier::Nft(_) => "nft",
        }
    }

    /// Applies a transaction: all of it, or none of it and the reason.
    pub async fn run(&self, tx: &Transaction) -> Result<Applied, NftError> {
        match self {
            Applier::Netlink(netlink) => Ok(netlink.apply(tx).await?),
            Applier::Nft(nft) => nft.run(tx).await,
        }
    }
}

/// How one transaction went in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Applied {
    pub operations: usize,
    pub bytes: usize,
    pub elapsed: Duration,
}

/// The `nft` program.
#[derive(Clone, Debug)]
pub struct Nft {
    path: PathBuf,
}

impl Nft {
    /// `nft` from `PATH` (or the path given), with its version checked.
    pub async fn find(path: Option<PathBuf>) -> Result<Nft, NftError> {
        let nft = Nft {
            path: path.unwrap_or_else(|| PathBuf::from("nft")),
        };
        let out = nft
            .command()
            .arg("--version")
            .output()
            .await
            .map_err(|source| NftError::Spawn {
                path: nft.path.display().to_string(),
                source,
            })?;
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        // "nftables v1.0.6 (Lester Gooch #5)"
        let version = text
            .split_whitespace()
            .find_map(|w| w.strip_prefix('v'))
            .unwrap_or_default()
            .to_owned();
        let parts: Vec<u32> = version
            .split('.')
            .map(|p| {
                p.trim_end_matches(|c: char| !c.is_ascii_digit())
                    .parse()
                    .unwrap_or(0)
            })
            .collect();
        let at_least = |want: [u32; 3]| {
            let have = [
                parts.first().copied().unwrap_or(0),
                parts.get(1).copied().unwrap_or(0),
                parts.get(2).copied().unwrap_or(0),
            ];
            have >= want
        };
        if !at_least([1, 0, 1]) {
            return Err(NftError::TooOld(if version.is_empty() {
                text.trim().to_owned()
            } else {
                version
            }));
        }
        Ok(nft)
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(&self.path);
        cmd.kill_on_drop(true);
        cmd
    }

    /// Applies a transaction: all of it, or none of it and nft's reason.
    pub async fn run(&self, tx: &Transaction) -> Result<Applied, NftError> {
        let start = Instant::now();
        let mut child = self
            .command()
            .args(["-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|source| NftError::Spawn {
                path: self.path.display().to_string(),
                source,
            })?;
        let mut bytes = 0;
        if let Some(mut stdin) = child.stdin.take() {
            let mut buf = String::with_capacity(CHUNK + 1024);
            let mut write_error = None;
            for (verb, object) in &tx.ops {
                render_op(tx.family, *verb, object, &mut buf);
                buf.push('\n');
                if buf.len() >= CHUNK {
                    bytes += buf.len();
                    if let Err(e) = stdin.write_all(buf.as_bytes()).await {
                        write_error = Some(e);
                        break;
                    }
                    buf.clear();
                }
            }
            if write_error.is_none() && !buf.is_empty() {
                bytes += buf.len();
                write_error = stdin.write_all(buf.as_bytes()).await.err();
            }
            drop(stdin);
            if let Some(e) = write_error {
                // nft stopped reading: its exit status and stderr say why.
                let out = child.wait_with_output().await.map_err(NftError::Write)?;
                if !out.status.success() {
                    return Err(refused(&out.status, &out.stderr));
                }
                return Err(NftError::Write(e));
            }
        }
        let out = child.wait_with_output().await.map_err(NftError::Write)?;
        if !out.status.success() {
            return Err(refused(&out.status, &out.stderr));
        }
        Ok(Applied {
            operations: tx.len(),
            bytes,
            elapsed: start.elapsed(),
        })
    }

    /// `nft -j list table <family> kube-proxy`.
    pub async fn list_json(&self, family: IpFamily) -> Result<String, NftError> {
        self.output(&["-j", "list", "table", family.nft(), TABLE])
            .await
    }

    /// `nft list table <family> kube-proxy`, as an operator reads it.
    pub async fn list_text(&self, family: IpFamily) -> Result<String, NftError> {
        self.output(&["list", "table", family.nft(), TABLE]).await
    }

    async fn output(&self, args: &[&str]) -> Result<String, NftError> {
        let out = self
            .command()
            .args(args)
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(|source| NftError::Spawn {
                path: self.path.display().to_string(),
                source,
            })?;
        if !out.status.success() {
            return Err(refused(&out.status, &out.stderr));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

fn refused(status: &std::process::ExitStatus, stderr: &[u8]) -> NftError {
    let mut text = String::from_utf8_lossy(stderr).trim().to_owned();
    // A refusal of a large transaction can name many lines: keep the first ones.
    if text.len() > 4096 {
        let mut end = 4096;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push_str(" ...");
    }
    NftError::Refused {
        status: status.to_string(),
        stderr: text,
    }
}
