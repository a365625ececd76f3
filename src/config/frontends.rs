//! The frontends one process serves: the one the upstream flags describe (always the first,
//! named `frontend`), then one per `[[frontend]]` table of the config file. The flags keep
//! meaning what they meant, so a command line or a file without `[[frontend]]` runs exactly the
//! one frontend it always ran.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{bind_addr, non_empty, FrontendAddr, Mode, Options, ValidationError};

/// The first frontend's name: the one the flags describe, and its socket unit's
/// `FileDescriptorName=`.
pub const FIRST_FRONTEND: &str = "frontend";

/// Socket-activation names of the other listeners, which no frontend may take.
const LISTENER_NAMES: &[&str] = &["agent", "health", "admin"];

/// One `[[frontend]]` table, as written in the file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FrontendOptions {
    /// Default `frontend-<n>`, n counting the flags' frontend as 1.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// `grpc` or `http-connect`; required.
    pub mode: String,
    /// A Unix socket; or else `bind_address` and `port` with `cert`, `key` and `ca_cert`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub uds_name: String,
    #[serde(default = "yes")]
    pub delete_existing_uds_file: bool,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub bind_address: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i64>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cert: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub ca_cert: String,
}

fn yes() -> bool {
    true
}

/// One frontend, validated: its protocol, where it listens, and (on TCP) its TLS files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frontend {
    /// Unique; the socket-activation name, the `frontend` metric label and the access line's
    /// `frontendName`.
    pub name: String,
    pub mode: Mode,
    pub addr: FrontendAddr,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// Verifies client certificates; required on TCP.
    pub ca_cert: Option<PathBuf>,
}

impl Frontend {
    /// How bind errors and accept-loop logs name its listener: `the frontend port` for the
    /// first, as always.
    pub fn what(&self) -> String {
        match self.addr {
            FrontendAddr::Uds { .. } => format!("the {} socket", self.name),
            FrontendAddr::Tcp(_) => format!("the {} port", self.name),
        }
    }

    /// Whether it listens where `other` does: the same socket file, or the same port on
    /// addresses that overlap.
    fn collides(&self, other: &FrontendAddr) -> bool {
        match (&self.addr, other) {
            (FrontendAddr::Uds { path: a, .. }, FrontendAddr::Uds { path: b, .. }) => a == b,
            (FrontendAddr::Tcp(a), FrontendAddr::Tcp(b)) => tcp_collides(*a, *b),
            _ => false,
        }
    }

    /// The flags' frontend (validated by upstream's rules before this).
    fn from_flags(options: &Options, mode: Mode) -> Result<Frontend, ValidationError> {
        let addr = if options.uds_name.is_empty() {
            FrontendAddr::Tcp(bind_addr(
                &options.server_bind_address,
                options.server_port,
            )?)
        } else {
            FrontendAddr::Uds {
                path: PathBuf::from(&options.uds_name),
                delete_existing: options.delete_existing_uds_file,
            }
        };
        Ok(Frontend {
            name: FIRST_FRONTEND.to_string(),
            mode,
            addr,
            cert: non_empty(&options.server_cert),
            key: non_empty(&options.server_key),
            ca_cert: non_empty(&options.server_ca_cert),
        })
    }

    /// One `[[frontend]]` table; `index` is its place among them (from 0), for messages.
    fn from_table(index: usize, table: &FrontendOptions) -> Result<Frontend, ValidationError> {
        let fail = |field: &str, message: String| {
            Err(ValidationError(format!(
                "frontend[{index}].{field}: {message}"
            )))
        };
        let mode = match Mode::parse(&table.mode) {
            Ok(mode) => mode,
            Err(e) => return fail("mode", e.0),
        };
        let name = if table.name.is_empty() {
            format!("{FIRST_FRONTEND}-{}", index + 2)
        } else {
            table.name.clone()
        };
        if let Some(problem) = name_problem(&name) {
            return fail("name", problem);
        }
        let tls = [
            ("cert", &table.cert),
            ("key", &table.key),
            ("ca_cert", &table.ca_cert),
        ];
        let addr = if !table.uds_name.is_empty() {
            if table.port.is_some_and(|port| port != 0) {
                return fail("port", "must not be set with uds_name".into());
            }
            if !table.bind_address.is_empty() {
                return fail("bind_address", "must not be set with uds_name".into());
            }
            if let Some((field, _)) = tls.iter().find(|(_, value)| !value.is_empty()) {
                return fail(field, "must not be set with uds_name".into());
            }
            FrontendAddr::Uds {
                path: PathBuf::from(&table.uds_name),
                delete_existing: table.delete_existing_uds_file,
            }
        } else {
            let Some(port) = table.port else {
                return fail("port", "either uds_name or port must be set".into());
            };
            if !(1024..=49151).contains(&port) {
                return fail("port", format!("{port} is not in 1024-49151"));
            }
            for (field, value) in tls {
                if value.is_empty() {
                    return fail(field, "must be set for a TCP frontend (mTLS)".into());
                }
                if !std::path::Path::new(value).exists() {
                    return fail(field, format!("{value}: no such file or directory"));
                }
            }
            match bind_addr(&table.bind_address, port) {
                Ok(addr) => FrontendAddr::Tcp(addr),
                Err(e) => return fail("bind_address", e.0),
            }
        };
        Ok(Frontend {
            name,
            mode,
            addr,
            cert: non_empty(&table.cert),
            key: non_empty(&table.key),
            ca_cert: non_empty(&table.ca_cert),
        })
    }
}

/// Two TCP addresses that one of them cannot be bound beside: the same port, and the same
/// address or either one every address.
fn tcp_collides(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port() && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// Why `name` cannot name a frontend: systemd's rules for `FileDescriptorName=` (printable
/// ASCII, no `:`, at most 255 characters), and names the first frontend and the other
/// listeners hold.
fn name_problem(name: &str) -> Option<String> {
    if name.is_empty()
        || name.len() > 255
        || !name.bytes().all(|b| b.is_ascii_graphic() && b != b':')
    {
        return Some(format!(
            "{name:?} is not a socket name (printable ASCII without spaces or ':', at most 255)"
        ));
    }
    if name == FIRST_FRONTEND || LISTENER_NAMES.contains(&name) {
        return Some(format!("{name:?} is the name of another listener"));
    }
    None
}

/// Every frontend: the flags' one first, then the `[[frontend]]` tables in order, each
/// validated, with no two on the same socket or port (nor on the agent, health or admin port).
pub(super) fn frontends(
    options: &Options,
    mode: Mode,
    others: &[(&str, SocketAddr)],
) -> Result<Vec<Frontend>, ValidationError> {
    let mut all = vec![Frontend::from_flags(options, mode)?];
    for (index, table) in options.frontend.iter().enumerate() {
        let frontend = Frontend::from_table(index, table)?;
        let field = match frontend.addr {
            FrontendAddr::Uds { .. } => "uds_name",
            FrontendAddr::Tcp(_) => "port",
        };
        let conflict = |message: String| {
            Err(ValidationError(format!(
                "frontend[{index}].{field}: {message}"
            )))
        };
        if let Some(other) = all.iter().find(|other| other.name == frontend.name) {
            return Err(ValidationError(format!(
                "frontend[{index}].name: {:?} is already the name of another frontend ({})",
                frontend.name,
                other.what()
            )));
        }
        if let Some(other) = all.iter().find(|other| frontend.collides(&other.addr)) {
            return conflict(format!("{} listens there already", other.what()));
        }
        if let FrontendAddr::Tcp(addr) = frontend.addr {
            if let Some((what, _)) = others.iter().find(|(_, other)| tcp_collides(addr, *other)) {
                return conflict(format!("port {} is also {what}", addr.port()));
            }
        }
        all.push(frontend);
    }
    Ok(all)
}

/// On reload: the frontends' listeners were bound at start, so when the new list differs in
/// any name, protocol or address, the running list stays; each running frontend still takes
/// the TLS files of the new frontend of its name (so the flags' `--server-cert` and friends
/// reload as they always did). Returns whether the running list was kept.
pub(super) fn keep_running(new: &mut Vec<Frontend>, running: &[Frontend]) -> bool {
    let listeners = |list: &[Frontend]| -> Vec<(String, Mode, FrontendAddr)> {
        list.iter()
            .map(|f| (f.name.clone(), f.mode, f.addr.clone()))
            .collect()
    };
    if listeners(new) == listeners(running) {
        return false;
    }
    let kept = running
        .iter()
        .map(|old| match new.iter().find(|f| f.name == old.name) {
            // Only files of the same kind of listener: a TCP frontend's certificates.
            Some(changed) if same_kind(&changed.addr, &old.addr) => Frontend {
                cert: changed.cert.clone(),
                key: changed.key.clone(),
                ca_cert: changed.ca_cert.clone(),
                ..old.clone()
            },
            _ => old.clone(),
        })
        .collect();
    *new = kept;
    true
}

fn same_kind(a: &FrontendAddr, b: &FrontendAddr) -> bool {
    matches!(
        (a, b),
        (FrontendAddr::Uds { .. }, FrontendAddr::Uds { .. })
            | (FrontendAddr::Tcp(_), FrontendAddr::Tcp(_))
    )
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::config::Config;

    /// A file's settings over the flags' UDS frontend (the agent port's files are not read
    /// by validation).
    fn config(file: &str) -> Result<Config, ValidationError> {
        let text =
            format!("uds_name = \"/run/k/first.sock\"\nserver_port = 0\nserver_id = \"s\"\n{file}");
        let options: Options = toml::from_str(&text).unwrap();
        Config::from_options(&options)
    }

    fn error(file: &str) -> String {
        config(file).unwrap_err().0
    }

    /// Existing TLS files for a TCP entry.
    fn tls_files() -> (tempfile::TempDir, String) {
        let dir = tempfile::tempdir().unwrap();
        let path = |name: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, "").unwrap();
            path.display().to_string()
        };
        let keys = format!(
            "cert = \"{}\"\nkey = \"{}\"\nca_cert = \"{}\"\n",
            path("c.crt"),
            path("c.key"),
            path("ca.crt")
        );
        (dir, keys)
    }

    #[test]
    fn the_flags_alone_describe_the_one_frontend_they_always_did() {
        let options = Options::parse_from_args([
            "konnectivity-server",
            "--uds-name=/run/k.sock",
            "--server-port=0",
            "--mode=http-connect",
        ])
        .unwrap();
        let config = Config::from_options(&options).unwrap();
        assert_eq!(
            config.frontends,
            [Frontend {
                name: "frontend".into(),
                mode: Mode::HttpConnect,
                addr: FrontendAddr::Uds {
                    path: "/run/k.sock".into(),
                    delete_existing: true
                },
                cert: None,
                key: None,
                ca_cert: None,
            }]
        );
    }

    #[test]
    fn a_frontend_table_adds_a_second_named_after_its_place() {
        let (_dir, keys) = tls_files();
        let config = config(&format!(
            "[[frontend]]\nmode = \"http-connect\"\nbind_address = \"127.0.0.1\"\nport = 8132\n{keys}\
             [[frontend]]\nname = \"tools\"\nmode = \"grpc\"\nuds_name = \"/run/k/tools.sock\"\n"
        ))
        .unwrap();
        let names: Vec<_> = config.frontends.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["frontend", "frontend-2", "tools"]);
        assert_eq!(config.frontends[0].mode, Mode::Grpc, "the flags' default");
        assert_eq!(config.frontends[1].mode, Mode::HttpConnect);
        assert_eq!(
            config.frontends[1].addr,
            FrontendAddr::Tcp("127.0.0.1:8132".parse().unwrap())
        );
        assert!(config.frontends[1].ca_cert.is_some());
        assert_eq!(
            config.frontends[2].addr,
            FrontendAddr::Uds {
                path: "/run/k/tools.sock".into(),
                delete_existing: true
            }
        );
    }

    #[test]
    fn conflicts_are_refused_naming_the_field() {
        let (_dir, keys) = tls_files();
        let tcp = |port: u16| {
            format!("[[frontend]]\nmode = \"grpc\"\nbind_address = \"127.0.0.1\"\nport = {port}\n{keys}")
        };
        assert_eq!(
            error("[[frontend]]\nmode = \"grpc\"\nuds_name = \"/run/k/first.sock\"\n"),
            "frontend[0].uds_name: the frontend socket listens there already"
        );
        assert_eq!(
            error(&format!("{}{}", tcp(8132), tcp(8132))),
            "frontend[1].port: the frontend-2 port listens there already"
        );
        assert_eq!(
            error(&tcp(8091)),
            "frontend[0].port: port 8091 is also the agent port"
        );
        assert_eq!(
            error(&format!("{}name = \"frontend\"\n", tcp(8132))),
            "frontend[0].name: \"frontend\" is the name of another listener"
        );
        assert_eq!(
            error(&format!(
                "{}name = \"x\"\n[[frontend]]\nname = \"x\"\nmode = \"grpc\"\nuds_name = \"/run/k/x\"\n",
                tcp(8132)
            )),
            "frontend[1].name: \"x\" is already the name of another frontend (the x port)"
        );
        assert_eq!(
            error("[[frontend]]\nmode = \"grpc\"\nport = 8132\n"),
            "frontend[0].cert: must be set for a TCP frontend (mTLS)"
        );
        assert_eq!(
            error("[[frontend]]\nmode = \"grpc\"\n"),
            "frontend[0].port: either uds_name or port must be set"
        );
        assert_eq!(
            error("[[frontend]]\nmode = \"grpc\"\nuds_name = \"/run/k/2\"\ncert = \"/c\"\n"),
            "frontend[0].cert: must not be set with uds_name"
        );
    }

    #[test]
    fn an_unknown_mode_is_refused_in_upstreams_words() {
        assert_eq!(
            error("[[frontend]]\nmode = \"tcp\"\nuds_name = \"/run/k/2.sock\"\n"),
            "frontend[0].mode: mode must be set to either 'grpc' or 'http-connect' not \"tcp\""
        );
        let missing = toml::from_str::<Options>("[[frontend]]\nuds_name = \"/x\"\n").unwrap_err();
        assert!(
            missing.to_string().contains("missing field `mode`"),
            "{missing}"
        );
    }

    #[test]
    fn a_reload_keeps_the_running_frontends_but_takes_their_new_tls_files() {
        let (_dir, keys) = tls_files();
        let running = config(&format!(
            "[[frontend]]\nmode = \"http-connect\"\nport = 8132\n{keys}"
        ))
        .unwrap();
        let (_other, new_keys) = tls_files();
        let mut reloaded = config(&format!(
            "[[frontend]]\nmode = \"grpc\"\nport = 8133\n{new_keys}\
             [[frontend]]\nmode = \"grpc\"\nuds_name = \"/run/k/3.sock\"\n"
        ))
        .unwrap();
        let new_cert = reloaded.frontends[1].cert.clone();
        let kept = reloaded.keep_restart_only(&running);
        assert_eq!(kept, ["frontends"]);
        assert_eq!(reloaded.frontends.len(), 2);
        assert_eq!(reloaded.frontends[1].mode, Mode::HttpConnect);
        assert_eq!(reloaded.frontends[1].addr, running.frontends[1].addr);
        assert_eq!(reloaded.frontends[1].cert, new_cert);
        // The same list again: nothing is kept.
        let mut same = running.clone();
        assert!(same.keep_restart_only(&running).is_empty());
    }
}
