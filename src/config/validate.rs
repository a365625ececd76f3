//! Upstream's validation of the command line: the same rules, messages and order.

use std::collections::BTreeMap;

use crate::policy::Policy;
use std::path::Path;

use super::{
    parse_labels, parse_proxy_strategies, parse_tls_version, Mode, Options, Strategy, TlsVersion,
    ValidationError,
};

/// The smallest per-tunnel queue limit: one maximum-size gRPC message must fit.
pub const MIN_FRONTEND_QUEUE_BYTES: i64 = 4 << 20;

/// Cipher suite names Go's `tls.CipherSuites()` lists (the ones upstream accepts). Since Go
/// 1.26, which upstream builds with, the `TLS_RSA_*` suites are in `InsecureCipherSuites()`
/// instead, so upstream refuses them at validation.
pub const GO_ACCEPTED_CIPHER_SUITES: &[&str] = &[
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
];

fn check_exists(path: &str, what: &str) -> Result<(), ValidationError> {
    match std::fs::metadata(path) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Err(ValidationError(format!(
            "error checking {what} {path}, got stat {path}: no such file or directory"
        ))),
        _ => Ok(()),
    }
}

fn check_pair(key: &str, cert: &str, prefix: &str) -> Result<(), ValidationError> {
    if !key.is_empty() {
        check_exists(key, &format!("{prefix} key"))?;
        if cert.is_empty() {
            return Err(ValidationError(format!(
                "cannot have {prefix} cert empty when {prefix} key is set to {key:?}"
            )));
        }
    }
    if !cert.is_empty() {
        check_exists(cert, &format!("{prefix} cert"))?;
        if key.is_empty() {
            return Err(ValidationError(format!(
                "cannot have {prefix} key empty when {prefix} cert is set to {cert:?}"
            )));
        }
    }
    Ok(())
}

fn check_port(port: i64, what: &str, reserved_allowed: bool) -> Result<(), ValidationError> {
    if port > 49151 {
        return Err(ValidationError(format!(
            "please do not try to use ephemeral port {port} for the {what} port"
        )));
    }
    if port < 1024 && !reserved_allowed {
        return Err(ValidationError(format!(
            "please do not try to use reserved port {port} for the {what} port"
        )));
    }
    Ok(())
}

/// The settings that validation parses, in their types.
pub(super) struct Checked {
    pub(super) mode: Mode,
    pub(super) proxy_strategies: Vec<Strategy>,
    pub(super) tls_min_version: TlsVersion,
    /// Empty without the lease controller.
    pub(super) lease_labels: BTreeMap<String, String>,
    pub(super) destinations: Policy,
}

impl Options {
    /// Upstream's `Validate()`: the same rules, messages and order; the first failure wins.
    pub fn validate(&self) -> Result<(), ValidationError> {
        self.check().map(|_| ())
    }

    /// [`Options::validate`], keeping what it parsed.
    pub(super) fn check(&self) -> Result<Checked, ValidationError> {
        let fail = |msg: String| Err(ValidationError(msg));
        check_pair(&self.server_key, &self.server_cert, "server")?;
        if !self.server_ca_cert.is_empty() {
            check_exists(&self.server_ca_cert, "server CA cert")?;
        }
        check_pair(&self.cluster_key, &self.cluster_cert, "cluster")?;
        if !self.cluster_ca_cert.is_empty() {
            check_exists(&self.cluster_ca_cert, "cluster CA cert")?;
        }
        // `--mode` stays text until here: upstream refuses a bad mode only after the TLS files
        // are checked, so parsing it with the flags would change which error comes first.
        let mode = Mode::parse(&self.mode)?;
        let uds = !self.uds_name.is_empty();
        if uds {
            if self.server_port != 0 {
                return fail(format!(
                    "server port should be set to 0 not {} for UDS",
                    self.server_port
                ));
            }
            for (value, name) in [
                (&self.server_key, "server key"),
                (&self.server_cert, "server cert"),
                (&self.server_ca_cert, "server ca cert"),
            ] {
                if !value.is_empty() {
                    return fail(format!("{name} should not be set for UDS"));
                }
            }
        } else if self.server_ca_cert.is_empty() {
            return fail("server ca cert must be set when in TCP mode (uds-name is empty)".into());
        }
        for (port, name) in [
            (self.server_port, "server"),
            (self.agent_port, "agent"),
            (self.admin_port, "admin"),
            (self.health_port, "health"),
        ] {
            check_port(port, name, false).or_else(|e| {
                // The frontend port may be "reserved" (0) when it is not used: UDS mode.
                if name == "server" && uds && port <= 49151 {
                    Ok(())
                } else {
                    Err(e)
                }
            })?;
        }
        if self.enable_contention_profiling && !self.enable_profiling {
            return fail(
                "if --enable-contention-profiling is set, --enable-profiling must also be set"
                    .into(),
            );
        }
        let token_auth = !self.agent_namespace.is_empty()
            || !self.agent_service_account.is_empty()
            || !self.authentication_audience.is_empty();
        if token_auth {
            if !self.cluster_ca_cert.is_empty() {
                return fail(
                    "--cluster-ca-cert can not be used when agent authentication is enabled".into(),
                );
            }
            for (value, flag) in [
                (&self.agent_namespace, "--agent-namespace"),
                (&self.agent_service_account, "--agent-service-account"),
                (&self.authentication_audience, "--authentication-audience"),
            ] {
                if value.is_empty() {
                    return fail(format!(
                        "{flag} cannot be empty when agent authentication is enabled"
                    ));
                }
            }
        }
        if !self.kubeconfig.is_empty() && !Path::new(&self.kubeconfig).exists() {
            return fail(format!(
                "checking KubeconfigPath {:?}, got stat {}: no such file or directory",
                self.kubeconfig, self.kubeconfig
            ));
        }
        if self.proxy_strategies.is_empty() {
            return fail("ProxyStrategies cannot be empty".into());
        }
        let proxy_strategies = parse_proxy_strategies(&self.proxy_strategies)
            .map_err(|err| ValidationError(format!("invalid proxy strategies: {err}")))?;
        if self.xfr_channel_size <= 0 {
            return fail(format!(
                "channel size {} must be greater than 0",
                self.xfr_channel_size
            ));
        }
        // The help text of the release we replace documents 0 as "no queue", so only
        // negative values are refused here.
        if self.frontend_write_channel_size < 0 {
            return fail(format!(
                "frontend write channel size {} must be greater than or equal to 0",
                self.frontend_write_channel_size
            ));
        }
        if self.frontend_queue_limit_bytes < MIN_FRONTEND_QUEUE_BYTES {
            return fail(format!(
                "frontend-queue-limit-bytes {} must be at least {MIN_FRONTEND_QUEUE_BYTES} (one 4 MiB message)",
                self.frontend_queue_limit_bytes
            ));
        }
        if self.frontend_queue_budget_bytes < self.frontend_queue_limit_bytes {
            return fail(format!(
                "frontend-queue-budget-bytes {} must be at least frontend-queue-limit-bytes ({})",
                self.frontend_queue_budget_bytes, self.frontend_queue_limit_bytes
            ));
        }
        if self.frontend_queue_stall_timeout.0 <= 0 {
            return fail(format!(
                "frontend-queue-stall-timeout must be > 0, got {}",
                self.frontend_queue_stall_timeout
            ));
        }
        let tls_min_version = parse_tls_version(&self.tls_min_version).map_err(ValidationError)?;
        // `--cipher-suites=` is pflag's empty list (clap reads it as one empty item).
        for suite in self.cipher_suites.iter().filter(|s| !s.is_empty()) {
            if !GO_ACCEPTED_CIPHER_SUITES.contains(&suite.as_str()) {
                return fail(format!(
                    "cipher suite {suite} not supported, doesn't exist or considered as insecure"
                ));
            }
        }
        let lease_labels = if self.enable_lease_controller {
            parse_labels(&self.lease_label).map_err(ValidationError)?
        } else {
            BTreeMap::new()
        };
        if self.graceful_shutdown_timeout.is_negative() {
            return fail(format!(
                "graceful-shutdown-timeout must be >= 0, got {}",
                self.graceful_shutdown_timeout
            ));
        }
        if self.startup_dial_grace.is_negative() {
            return fail(format!(
                "startup-dial-grace must be >= 0, got {}",
                self.startup_dial_grace
            ));
        }
        for (name, value) in [
            ("agent-ping-interval", self.agent_ping_interval),
            ("agent-ping-dial-wait", self.agent_ping_dial_wait),
            ("agent-suspect-timeout", self.agent_suspect_timeout),
            ("agent-retire-timeout", self.agent_retire_timeout),
        ] {
            if value.is_negative() {
                return fail(format!("{name} must be >= 0, got {value}"));
            }
        }
        if self.agent_ping_interval.0 > 0
            && (self.agent_suspect_timeout.0 <= 0
                || self.agent_retire_timeout.0 <= self.agent_suspect_timeout.0)
        {
            return fail(format!(
                "agent-retire-timeout ({}) must be longer than agent-suspect-timeout ({}), which must be > 0",
                self.agent_retire_timeout, self.agent_suspect_timeout
            ));
        }
        if self.backend_dial_timeout.is_negative() {
            return fail(format!(
                "backend-dial-timeout must be >= 0, got {}",
                self.backend_dial_timeout
            ));
        }
        // Upstream parses the lease labels on every start, lease controller or not, and
        // refuses to run when they do not parse (`--lease-label=` gives "empty string
        // provided"); it does so after validation, so this comes last.
        if !self.enable_lease_controller {
            parse_labels(&self.lease_label).map_err(ValidationError)?;
        }
        let destinations = Policy::from_lists(&self.allow_destinations, &self.deny_destinations)
            .map_err(ValidationError)?;
        Ok(Checked {
            mode,
            proxy_strategies,
            tls_min_version,
            lease_labels,
            destinations,
        })
    }
}
