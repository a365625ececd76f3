//! `--dev`: an embedded development setup that needs nothing created by hand.

use std::path::{Path, PathBuf};

use crate::config::Options;
use crate::tls::DevPki;

/// Where `--dev` keeps its CA and certificates.
pub fn default_state_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("konnectivity-server");
    }
    if let Some(home) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(home).join(".local/state/konnectivity-server");
    }
    std::env::temp_dir().join(format!("konnectivity-server-state-{}", uid()))
}

/// Where `--dev` puts the frontend socket.
pub fn default_runtime_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("konnectivity-server");
    }
    std::env::temp_dir().join(format!("konnectivity-server-{}", uid()))
}

#[allow(unsafe_code)] // a documented site: see the SAFETY note
fn uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}

fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// What `--dev` set up, to print for the user.
pub struct DevSetup {
    pub pki: DevPki,
    pub generated: bool,
    pub socket: PathBuf,
}

/// Fills in whatever the user left at its default: a UDS frontend in the runtime directory and
/// the development certificates on the agent port.
pub fn apply(options: &mut Options) -> anyhow::Result<DevSetup> {
    let state = options
        .dev_state_dir
        .clone()
        .unwrap_or_else(default_state_dir);
    let pki_dir = state.join("pki");
    create_private_dir(&state)?;
    let (pki, generated) = DevPki::ensure(&pki_dir).map_err(|e| {
        anyhow::anyhow!(
            "generating the development CA in {}: {e}",
            pki_dir.display()
        )
    })?;
    if options.uds_name.is_empty() && options.server_cert.is_empty() {
        let runtime = default_runtime_dir();
        create_private_dir(&runtime)?;
        options.uds_name = runtime
            .join("konnectivity-server.socket")
            .display()
            .to_string();
        if options.server_port == 8090 {
            options.server_port = 0;
        }
    }
    if options.cluster_cert.is_empty() && options.cluster_key.is_empty() {
        options.cluster_cert = pki.server_cert.display().to_string();
        options.cluster_key = pki.server_key.display().to_string();
        if options.cluster_ca_cert.is_empty() && options.agent_namespace.is_empty() {
            options.cluster_ca_cert = pki.ca_cert.display().to_string();
        }
    }
    Ok(DevSetup {
        socket: PathBuf::from(&options.uds_name),
        pki,
        generated,
    })
}

impl DevSetup {
    /// A human summary with a ready-to-paste agent command.
    pub fn describe(&self, agent_port: i64) -> String {
        let pki = &self.pki;
        format!(
            "konnectivity-server development mode\n\
             \x20 {what} development CA and certificates in {dir}\n\
             \x20 frontend (gRPC, for kube-apiserver's egress selector): {socket}\n\
             \x20 connect our agent with (from this checkout):\n\
             \x20   cargo run --bin konnectivity-agent -- --dev\n\
             \x20 or any agent, upstream's proxy-agent too, with:\n\
             \x20   proxy-agent --ca-cert={ca} --agent-cert={cert} --agent-key={key} \\\n\
             \x20     --proxy-server-host=127.0.0.1 --proxy-server-port={agent_port}\n",
            what = if self.generated {
                "generated a"
            } else {
                "using the"
            },
            dir = pki.ca_cert.parent().unwrap_or(Path::new(".")).display(),
            socket = self.socket.display(),
            ca = pki.ca_cert.display(),
            cert = pki.agent_cert.display(),
            key = pki.agent_key.display(),
        )
    }
}
