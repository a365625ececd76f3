//! `kube-proxy trace`: where would a new connection go? Reads the table the kernel holds
//! (over netlink, as the proxy itself reads it at start-up, so the `nft` program is not
//! needed; `nft -j list table` only when that fails), walks the connection's first packet
//! through it with the tracer the proxy's own tests use, and prints the rules it meets and
//! where it ends: the endpoints a random pick may choose (and whether the endpoint sees the
//! client's address or the node's), a drop or a reject.
//!
//! ```text
//! kube-proxy trace --from 10.244.1.2 --to 10.96.0.10:53 --protocol udp
//! ```

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;

use clap::Parser;

use super::interfaces::interface_addresses;
use super::model::{IpFamily, Protocol};
use super::nft::exec::Nft;
use super::nft::json::parse_table;
use super::nft::netlink::Netlink;
use super::nft::table::Table;
use super::trace::{trace, Fate, NodeAddrs, Outcome, Packet};

pub const NAME: &str = "trace";

/// Where a new connection to a Service would go, according to the rules in this node's
/// kernel.
#[derive(Parser, Debug)]
#[command(name = "kube-proxy trace")]
pub struct TraceArgs {
    /// The client's address (a pod's, the node's own, or an outside client's).
    #[arg(long)]
    pub from: IpAddr,
    /// The destination: a ClusterIP, external IP, load-balancer IP or node address, and port.
    #[arg(long)]
    pub to: SocketAddr,
    /// tcp, udp or sctp.
    #[arg(long, default_value = "tcp")]
    pub protocol: String,
    /// The interface the packet arrives on (for local-traffic detection by interface).
    #[arg(long)]
    pub iif: Option<String>,
    /// The node's own addresses (default: those of this network namespace's interfaces).
    #[arg(long = "node-ip", value_delimiter = ',')]
    pub node_ips: Vec<IpAddr>,
    /// Read the table from this file (`nft -j list table ...` output) instead of the kernel.
    #[arg(long)]
    pub ruleset: Option<std::path::PathBuf>,
    /// Print the outcome as JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("protocol {0:?} is not tcp, udp or sctp")]
    Protocol(String),
    #[error("--from and --to are of different IP families")]
    Families,
    #[error("{0}")]
    Nft(#[from] super::nft::exec::NftError),
    #[error("{0}")]
    Json(#[from] super::nft::json::JsonError),
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
    #[error("the kernel has no table {0} kube-proxy")]
    NoTable(&'static str),
    #[error("reading the table over netlink: {netlink}; and with nft: {nft}")]
    Unreadable { netlink: String, nft: String },
}

/// Traces `args` and returns what to print.
pub async fn run(args: &TraceArgs) -> Result<(Outcome, Packet), TraceError> {
    let protocol = Protocol::from_nft(&args.protocol.to_ascii_lowercase())
        .ok_or_else(|| TraceError::Protocol(args.protocol.clone()))?;
    let family = IpFamily::of(&args.to.ip());
    if IpFamily::of(&args.from) != family {
        return Err(TraceError::Families);
    }
    let table = match &args.ruleset {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| TraceError::Read {
                path: path.display().to_string(),
                source,
            })?;
            parse_table(&text, family)?
        }
        None => kernel_table(family).await?,
    };
    let node = if args.node_ips.is_empty() {
        NodeAddrs::new(
            interface_addresses()
                .into_iter()
                .filter(|ip| !ip.is_loopback()),
        )
    } else {
        NodeAddrs::new(args.node_ips.iter().copied())
    };
    let packet = Packet {
        src: args.from,
        dst: args.to.ip(),
        protocol,
        port: args.to.port(),
        iif: args.iif.clone(),
    };
    Ok((trace(&table, &node, &packet), packet))
}

/// The kernel's table of `family`: read over netlink, or listed by nft when that fails.
async fn kernel_table(family: IpFamily) -> Result<Table, TraceError> {
    let netlink = match Netlink::open() {
        Ok(netlink) => match netlink.read_table(family).await {
            Ok(Some(listing)) => return Ok(listing.table),
            Ok(None) => return Err(TraceError::NoTable(family.nft())),
            Err(e) => e.to_string(),
        },
        Err(e) => e.to_string(),
    };
    let listed = match Nft::find(None).await {
        Ok(nft) => nft.list_json(family).await,
        Err(e) => Err(e),
    };
    match listed {
        Ok(text) => Ok(parse_table(&text, family)?),
        Err(nft) => Err(TraceError::Unreadable {
            netlink,
            nft: nft.to_string(),
        }),
    }
}

pub fn render(outcome: &Outcome, packet: &Packet, json: bool) -> String {
    if json {
        let branches: Vec<serde_json::Value> = outcome
            .branches
            .iter()
            .map(|b| {
                serde_json::json!({
                    "endpoint": b.endpoint.map(|(ip, port)| SocketAddr::new(ip, port).to_string()),
                    "masquerade": b.masquerade,
                    "fate": match b.fate {
                        Fate::Accepted => "accept",
                        Fate::Dropped => "drop",
                        Fate::Rejected => "reject",
                    },
                })
            })
            .collect();
        return serde_json::json!({
            "summary": outcome.summary(),
            "masquerade": outcome.masquerade(),
            "branches": branches,
            "path": outcome.path,
            "unknown": outcome.unknown,
        })
        .to_string();
    }
    format!(
        "{} {} -> {}:{}\n{outcome}",
        packet.protocol.nft(),
        packet.src,
        packet.dst,
        packet.port
    )
}

/// `kube-proxy trace ...`: the subcommand's whole run. Exit 0 when the trace ran.
pub fn main(args: Vec<std::ffi::OsString>) -> ExitCode {
    let parsed = match TraceArgs::try_parse_from(args.into_iter().skip(1)) {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("Error: {}", TraceError::Runtime(e));
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(&parsed)) {
        Ok((outcome, packet)) => {
            println!("{}", render(&outcome, &packet, parsed.json));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("Error: {e}");
            ExitCode::from(1)
        }
    }
}
