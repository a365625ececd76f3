//! `konnectivity-server tunnels`: the tunnels a running server holds, as a table (or its
//! admin port's JSON), and `tunnels close ID`, through the admin port's `/tunnels`.
//!
//! Only a first argument `tunnels` selects it, so every upstream command line still means what
//! it meant (upstream ignores arguments that are not flags; so does the server otherwise).

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use bytes::Bytes;
use clap::{Parser, Subcommand, ValueEnum};
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;

/// The first argument that selects this command.
pub const NAME: &str = "tunnels";

/// How long one request to the admin port may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// List the tunnels a running konnectivity-server holds, or close one, through its admin port.
///
/// The table's TX is the bytes the frontend sent toward the agent, RX the bytes the frontend
/// took from the agent; QUEUED is what waits for the frontend, STALLED whether the frontend's
/// reader took none of it lately.
///
/// `konnectivity-server tunnels close ID [--agent AGENT]` closes one established tunnel: its
/// frontend gets CLOSE_RSP, its agent CLOSE_REQ. The server must run with
/// --enable-tunnel-close; `--agent` names the agent when several use the connection id.
#[derive(Parser, Debug, Clone, PartialEq)]
#[command(
    name = "tunnels",
    bin_name = "konnectivity-server tunnels",
    disable_help_subcommand = true
)]
pub struct TunnelsArgs {
    /// The server's admin address (its --admin-bind-address).
    #[arg(long, default_value = "127.0.0.1", global = true)]
    pub admin_address: String,
    /// The server's admin port (its --admin-port).
    #[arg(long, default_value_t = 8095, global = true)]
    pub admin_port: u16,
    /// Only the tunnels of this agent id.
    #[arg(long)]
    pub agent: Option<String>,
    /// Only the tunnels to this destination: host:port exactly, or a host on any port.
    #[arg(long)]
    pub destination: Option<String>,
    /// Output: a table, or the admin port's JSON as it is.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    #[command(subcommand)]
    pub action: Option<Action>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Subcommand, Debug, Clone, PartialEq)]
pub enum Action {
    /// Close one established tunnel: its frontend gets CLOSE_RSP, its agent CLOSE_REQ. The
    /// server must run with --enable-tunnel-close.
    Close {
        /// The connection id (the CONN column).
        connection_id: i64,
        /// The agent that holds it, when several agents use the same connection id.
        #[arg(long)]
        agent: Option<String>,
    },
}

/// Why the admin port could not answer.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to the admin port {0}: {1}")]
    Connect(String, std::io::Error),
    #[error("the admin port {0}: {1}")]
    Http(String, hyper::Error),
    #[error("the admin port {0} did not answer within {REQUEST_TIMEOUT:?}")]
    Timeout(String),
    #[error("the admin port answered {0}: {1}")]
    Status(StatusCode, String),
    #[error("the admin port's /tunnels is not the JSON expected: {0}")]
    Json(#[from] serde_json::Error),
    #[error("cannot start the async runtime: {0}")]
    Runtime(std::io::Error),
}

/// Runs the command: `args` is the whole command line (program name, `tunnels`, ...).
pub fn main(args: Vec<OsString>) -> ExitCode {
    let mut args = args;
    if args.len() > 1 {
        // `konnectivity-server tunnels ...` reads as the command `tunnels ...`.
        args.remove(0);
    }
    let parsed = match TunnelsArgs::try_parse_from(args) {
        Ok(parsed) => parsed,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    match run(&parsed) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("Error: {e}");
            ExitCode::from(1)
        }
    }
}

/// What the command prints, or why it failed.
pub fn run(args: &TunnelsArgs) -> Result<String, ClientError> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ClientError::Runtime)?;
    runtime.block_on(async {
        match &args.action {
            Some(Action::Close {
                connection_id,
                agent,
            }) => {
                let mut path = format!("/tunnels/{connection_id}/close");
                if let Some(agent) = agent {
                    path.push('?');
                    path.push_str(&query(&[("agent", agent)]));
                }
                let body = request(args, Method::POST, &path).await?;
                Ok(String::from_utf8_lossy(&body).into_owned())
            }
            None => {
                let mut pairs = Vec::new();
                if let Some(agent) = &args.agent {
                    pairs.push(("agent", agent.as_str()));
                }
                if let Some(destination) = &args.destination {
                    pairs.push(("destination", destination.as_str()));
                }
                let mut path = "/tunnels".to_string();
                if !pairs.is_empty() {
                    path.push('?');
                    path.push_str(&query(&pairs));
                }
                let body = request(args, Method::GET, &path).await?;
                match args.output {
                    Output::Json => Ok(String::from_utf8_lossy(&body).into_owned()),
                    Output::Table => Ok(table(&serde_json::from_slice(&body)?)),
                }
            }
        }
    })
}

fn query(pairs: &[(&str, &str)]) -> String {
    form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}

/// One HTTP/1.1 request to the admin port; the body of a 2xx answer.
async fn request(args: &TunnelsArgs, method: Method, path: &str) -> Result<Bytes, ClientError> {
    let host = args.admin_address.trim_matches(['[', ']']);
    let shown = if host.contains(':') {
        format!("[{host}]:{}", args.admin_port)
    } else {
        format!("{host}:{}", args.admin_port)
    };
    let exchange = async {
        let stream = tokio::net::TcpStream::connect((host, args.admin_port))
            .await
            .map_err(|e| ClientError::Connect(shown.clone(), e))?;
        let http = |e| ClientError::Http(shown.clone(), e);
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(http)?;
        tokio::spawn(connection);
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, &shown)
            .body(Empty::<Bytes>::new())
            .expect("static request parts are valid");
        let response = sender.send_request(request).await.map_err(http)?;
        let status = response.status();
        let body = response.into_body().collect().await.map_err(http)?;
        let body = body.to_bytes();
        if !status.is_success() {
            let text = String::from_utf8_lossy(&body).trim_end().to_string();
            return Err(ClientError::Status(status, text));
        }
        Ok(body)
    };
    tokio::time::timeout(REQUEST_TIMEOUT, exchange)
        .await
        .map_err(|_| ClientError::Timeout(shown.clone()))?
}

pub const COLUMNS: [&str; 12] = [
    "CONN",
    "DIAL",
    "FRONTEND",
    "PEER",
    "AGENT",
    "DESTINATION",
    "STATE",
    "AGE",
    "TX",
    "RX",
    "QUEUED",
    "STALLED",
];

/// The `/tunnels` JSON as a table, columns padded as `kubectl get` pads them.
pub fn table(tunnels: &serde_json::Value) -> String {
    let empty = Vec::new();
    let rows: Vec<[String; 12]> = tunnels
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .map(row)
        .collect();
    let mut widths = COLUMNS.map(str::len);
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let header = COLUMNS.map(String::from);
    for cells in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (i, (cell, width)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}   "));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn row(t: &serde_json::Value) -> [String; 12] {
    let field = |key: &str| -> String {
        match &t[key] {
            serde_json::Value::Null => "-".into(),
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        }
    };
    let frontend = |key: &str| -> String {
        t["frontend"][key]
            .as_str()
            .map_or_else(|| "-".into(), String::from)
    };
    let stalled = match t["reader_stalled"].as_bool() {
        Some(true) => "yes",
        _ => "no",
    };
    [
        field("connection_id"),
        field("dial_id"),
        frontend("kind"),
        frontend("peer"),
        field("agent_id"),
        field("destination"),
        field("state"),
        t["age_seconds"]
            .as_f64()
            .map_or_else(|| "-".into(), |s| age(Duration::from_secs_f64(s.max(0.0)))),
        field("bytes_to_agent"),
        field("bytes_to_frontend"),
        field("queued_bytes"),
        stalled.into(),
    ]
}

/// An age as `kubectl get` shows one: 42s, 5m3s, 3h12m, 2d4h.
fn age(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        3600..86400 => format!("{}h{}m", s / 3600, s % 3600 / 60),
        _ => format!("{}d{}h", s / 86400, s % 86400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_and_filters_parse() {
        let a = TunnelsArgs::try_parse_from(["tunnels", "--agent=a", "-o", "json"]).unwrap();
        assert_eq!(a.agent.as_deref(), Some("a"));
        assert_eq!(a.output, Output::Json);
        assert_eq!(a.admin_port, 8095);
        let c = TunnelsArgs::try_parse_from(["tunnels", "close", "7", "--admin-port=9"]).unwrap();
        assert_eq!(
            c.action,
            Some(Action::Close {
                connection_id: 7,
                agent: None
            })
        );
        assert_eq!(c.admin_port, 9);
    }

    #[test]
    fn a_table_has_one_row_per_tunnel() {
        let json = serde_json::json!([{
            "connection_id": 3, "dial_id": 11, "frontend": {"kind": "grpc", "peer": "@"},
            "agent_id": "a", "destination": "10.0.0.1:443", "state": "established",
            "age_seconds": 65.2, "bytes_to_agent": 5, "bytes_to_frontend": 6,
            "queued_bytes": 0, "reader_stalled": false,
        }, {
            "connection_id": 4, "dial_id": null, "frontend": null, "agent_id": "a",
            "destination": null, "state": "closing", "age_seconds": 0.1,
            "bytes_to_agent": 0, "bytes_to_frontend": 0, "queued_bytes": 0,
            "reader_stalled": false,
        }]);
        let out = table(&json);
        let lines: Vec<Vec<&str>> = out
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(lines[0], COLUMNS);
        assert_eq!(
            lines[1],
            [
                "3",
                "11",
                "grpc",
                "@",
                "a",
                "10.0.0.1:443",
                "established",
                "1m5s",
                "5",
                "6",
                "0",
                "no"
            ]
        );
        assert_eq!(lines[2][6], "closing");
        assert_eq!(lines[2][2], "-");
    }
}
