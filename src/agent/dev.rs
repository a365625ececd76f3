//! `--dev` for the agent: connect to a `konnectivity-server --dev` on this machine with the
//! development CA and agent certificate that the server generated.

use std::path::PathBuf;

use super::options::AgentOptions;
use crate::tls::DevPki;

#[derive(Debug, thiserror::Error)]
#[error(
    "no development CA in {0}: start `konnectivity-server --dev` first (it generates one), \
     or give --dev-state-dir"
)]
pub struct NoDevPki(PathBuf);

/// Fills in what the user left at its default: the CA and the agent's certificate and key.
pub fn apply(options: &mut AgentOptions) -> Result<(), NoDevPki> {
    let state = options
        .dev_state_dir
        .clone()
        .unwrap_or_else(crate::dev::default_state_dir);
    let pki = DevPki::in_dir(&state.join("pki"));
    if !pki.ca_cert.exists() || !pki.agent_cert.exists() || !pki.agent_key.exists() {
        return Err(NoDevPki(state));
    }
    if options.ca_cert.is_empty() {
        options.ca_cert = pki.ca_cert.display().to_string();
    }
    if options.agent_cert.is_empty() && options.agent_key.is_empty() {
        options.agent_cert = pki.agent_cert.display().to_string();
        options.agent_key = pki.agent_key.display().to_string();
    }
    Ok(())
}
