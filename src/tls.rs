//! TLS for the agent port and the TCP frontend: PEM loading (RSA, ECDSA; PKCS#1, PKCS#8,
//! SEC1), client-certificate verification, Go cipher-suite names and minimum versions mapped
//! onto rustls, and ALPN.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::ring as provider;
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, SupportedCipherSuite};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::TlsVersion;

/// Each message carries its cause in its own text, and no variant reports a `source()`: with
/// anyhow's `{:#}`, a cause that is both in the text and the source chain prints twice.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("failed to read certificate {path}: {reason}")]
    Cert {
        path: PathBuf,
        reason: rustls_pki_types::pem::Error,
    },
    #[error("no certificate found in {0}")]
    NoCert(PathBuf),
    #[error("failed to read private key {path}: {reason}")]
    Key {
        path: PathBuf,
        reason: rustls_pki_types::pem::Error,
    },
    #[error("failed to load CA cert: {path}: {reason}")]
    Ca { path: PathBuf, reason: String },
    #[error("certificate {cert} and key {key} do not form a usable pair: {reason}")]
    Pair {
        cert: PathBuf,
        key: PathBuf,
        reason: rustls::Error,
    },
    #[error("no TLS 1.2 cipher suite left: none of {0:?} is implemented")]
    NoCipherSuite(Vec<String>),
    #[error("a certificate and key are required for {0}")]
    Missing(&'static str),
}

/// The TLS inputs for one listener.
#[derive(Clone, Debug)]
pub struct TlsFiles<'a> {
    pub cert: &'a Path,
    pub key: &'a Path,
    pub client_ca: Option<&'a Path>,
}

/// Policy shared by every TLS listener (`--cipher-suites`, `--tls-min-version`).
#[derive(Clone, Debug)]
pub struct TlsPolicy<'a> {
    pub cipher_suites: &'a [String],
    pub min_version: TlsVersion,
}

pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|reason| TlsError::Cert {
            path: path.to_path_buf(),
            reason,
        })?;
    if certs.is_empty() {
        return Err(TlsError::NoCert(path.to_path_buf()));
    }
    Ok(certs)
}

pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|reason| TlsError::Key {
        path: path.to_path_buf(),
        reason,
    })
}

fn load_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let ca_error = |reason: String| TlsError::Ca {
        path: path.to_path_buf(),
        reason,
    };
    let certs = load_certs(path).map_err(|e| ca_error(e.to_string()))?;
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots.add(cert).map_err(|e| ca_error(e.to_string()))?;
    }
    Ok(roots)
}

/// Go's names of the TLS 1.3 suites (always enabled; listing them changes nothing).
pub const TLS13_SUITE_NAMES: &[&str] = &[
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
];

/// Maps Go's cipher-suite names onto the suites rustls implements. Names rustls lacks (CBC,
/// RSA key exchange) are returned separately so the caller can warn about them.
pub fn select_cipher_suites(names: &[String]) -> (Vec<SupportedCipherSuite>, Vec<String>) {
    let mut chosen = Vec::new();
    let mut unsupported = Vec::new();
    for name in names {
        let found = provider::ALL_CIPHER_SUITES.iter().find(|suite| {
            let ours = format!("{:?}", suite.suite());
            // rustls spells the ChaCha suites without Go's trailing `_SHA256`.
            ours == *name || format!("{ours}_SHA256") == *name
        });
        match found {
            Some(suite) if !chosen.contains(suite) => chosen.push(*suite),
            Some(_) => {}
            None => unsupported.push(name.clone()),
        }
    }
    (chosen, unsupported)
}

/// The agent's TLS toward its servers, as upstream's agent sets it up: TLS 1.2 or 1.3, trust
/// only `ca` (no system roots), present `identity` (certificate, key) when given, and offer
/// `alpn` in its order. The server name is checked by the connector (`--proxy-server-host`).
pub fn client_config(
    ca: &Path,
    identity: Option<(&Path, &Path)>,
    alpn: &[Vec<u8>],
) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let roots = load_roots(ca)?;
    let builder =
        rustls::ClientConfig::builder_with_provider(Arc::new(provider::default_provider()))
            .with_protocol_versions(&[&rustls::version::TLS12, &rustls::version::TLS13])
            .expect("ring supports TLS 1.2 and 1.3")
            .with_root_certificates(roots);
    let mut config = match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(load_certs(cert)?, load_key(key)?)
            .map_err(|reason| TlsError::Pair {
                cert: cert.to_path_buf(),
                key: key.to_path_buf(),
                reason,
            })?,
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn.to_vec();
    Ok(Arc::new(config))
}

/// Builds a server config. `alpn` is `h2` for the gRPC ports and `http/1.1` for CONNECT.
pub fn server_config(
    files: &TlsFiles<'_>,
    policy: &TlsPolicy<'_>,
    alpn: &[&[u8]],
) -> Result<Arc<ServerConfig>, TlsError> {
    let certs = load_certs(files.cert)?;
    let key = load_key(files.key)?;
    let mut crypto = provider::default_provider();
    let mut tls13_only = policy.min_version == TlsVersion::Tls13;
    if !policy.cipher_suites.is_empty() {
        let tls12_names: Vec<String> = policy
            .cipher_suites
            .iter()
            .filter(|name| !TLS13_SUITE_NAMES.contains(&name.as_str()))
            .cloned()
            .collect();
        let (chosen, unsupported) = select_cipher_suites(&tls12_names);
        for name in &unsupported {
            tracing::warn!(
                cipher_suite = %name,
                "cipher suite is not implemented by this server (CBC and RSA key exchange are not offered); ignoring it"
            );
        }
        let tls12: Vec<SupportedCipherSuite> = chosen
            .into_iter()
            .filter(|s| s.version() == &rustls::version::TLS12)
            .collect();
        // Names of TLS 1.3 suites are accepted and change nothing (as in Go): only the
        // others ask for TLS 1.2 suites.
        if tls12.is_empty() {
            if !tls12_names.is_empty() {
                return Err(TlsError::NoCipherSuite(policy.cipher_suites.to_vec()));
            }
            // Only TLS 1.3 names: as in Go, no TLS 1.2 suite is allowed, so only TLS 1.3
            // handshakes succeed.
            if !tls13_only {
                tracing::warn!(
                    cipher_suites = ?policy.cipher_suites,
                    "--cipher-suites names only TLS 1.3 suites, which are not configurable: no TLS 1.2 suite is allowed, so only TLS 1.3 is served"
                );
            }
            tls13_only = true;
        }
        // TLS 1.3 suites are not configurable in Go either: keep them all.
        let mut suites: Vec<SupportedCipherSuite> = provider::ALL_CIPHER_SUITES
            .iter()
            .copied()
            .filter(|s| s.version() == &rustls::version::TLS13)
            .collect();
        suites.extend(tls12);
        crypto.cipher_suites = suites;
    }
    let versions: &[&rustls::SupportedProtocolVersion] = if tls13_only {
        &[&rustls::version::TLS13]
    } else {
        &[&rustls::version::TLS12, &rustls::version::TLS13]
    };
    let crypto = Arc::new(crypto);
    let builder = ServerConfig::builder_with_provider(crypto.clone())
        .with_protocol_versions(versions)
        .expect("ring supports TLS 1.2 and 1.3");
    let builder = match files.client_ca {
        Some(ca) => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(load_roots(ca)?), crypto)
                    .build()
                    .map_err(|e| TlsError::Ca {
                        path: ca.to_path_buf(),
                        reason: e.to_string(),
                    })?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|reason| TlsError::Pair {
            cert: files.cert.to_path_buf(),
            key: files.key.to_path_buf(),
            reason,
        })?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// Why a development PKI could not be made.
#[derive(Debug, thiserror::Error)]
pub enum DevPkiError {
    #[error("cannot write {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot generate a key or certificate: {0}")]
    Generate(#[from] rcgen::Error),
}

/// Files of a development PKI: a CA, a server certificate for localhost and an agent client
/// certificate, all signed by the CA.
#[derive(Clone, Debug)]
pub struct DevPki {
    pub ca_cert: PathBuf,
    pub ca_key: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub agent_cert: PathBuf,
    pub agent_key: PathBuf,
}

impl DevPki {
    pub fn in_dir(dir: &Path) -> DevPki {
        DevPki {
            ca_cert: dir.join("ca.crt"),
            ca_key: dir.join("ca.key"),
            server_cert: dir.join("server.crt"),
            server_key: dir.join("server.key"),
            agent_cert: dir.join("agent.crt"),
            agent_key: dir.join("agent.key"),
        }
    }

    fn complete(&self) -> bool {
        [
            &self.ca_cert,
            &self.server_cert,
            &self.server_key,
            &self.agent_cert,
            &self.agent_key,
        ]
        .iter()
        .all(|p| p.exists())
    }

    /// Generates the PKI under `dir` unless a complete one is already there.
    /// Returns whether it generated anything.
    pub fn ensure(dir: &Path) -> Result<(DevPki, bool), DevPkiError> {
        let pki = DevPki::in_dir(dir);
        if pki.complete() {
            return Ok((pki, false));
        }
        std::fs::create_dir_all(dir).map_err(|source| DevPkiError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        pki.generate()?;
        Ok((pki, true))
    }

    fn generate(&self) -> Result<(), DevPkiError> {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
            KeyUsagePurpose,
        };
        let mut ca_params = CertificateParams::default();
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "konnectivity-server development CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_key = KeyPair::generate()?;
        let ca = rcgen::CertifiedIssuer::self_signed(ca_params, ca_key)?;

        let leaf = |cn: &str, sans: Vec<String>, usage: ExtendedKeyUsagePurpose| {
            let mut params = CertificateParams::new(sans)?;
            params.distinguished_name.push(DnType::CommonName, cn);
            params.extended_key_usages = vec![usage];
            let key = KeyPair::generate()?;
            let cert = params.signed_by(&key, &ca)?;
            Ok::<_, rcgen::Error>((cert.pem(), key.serialize_pem()))
        };
        let (server_cert, server_key) = leaf(
            "konnectivity-server",
            vec!["localhost".into(), "127.0.0.1".into(), "::1".into()],
            ExtendedKeyUsagePurpose::ServerAuth,
        )?;
        let (agent_cert, agent_key) = leaf(
            "konnectivity-agent",
            vec![],
            ExtendedKeyUsagePurpose::ClientAuth,
        )?;
        let write = |path: &Path, text: &str, private: bool| {
            write_file(path, text, private).map_err(|source| DevPkiError::Io {
                path: path.to_path_buf(),
                source,
            })
        };
        write(&self.ca_cert, &ca.pem(), false)?;
        write(&self.ca_key, &ca.key().serialize_pem(), true)?;
        write(&self.server_cert, &server_cert, false)?;
        write(&self.server_key, &server_key, true)?;
        write(&self.agent_cert, &agent_cert, false)?;
        write(&self.agent_key, &agent_key, true)?;
        Ok(())
    }
}

fn write_file(path: &Path, text: &str, private: bool) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mode = if private { 0o600 } else { 0o644 };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(path)?;
    file.write_all(text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dev_pki_that_cannot_be_written_says_where_and_why() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, "").unwrap();
        let err = DevPki::ensure(&file.join("pki")).unwrap_err();
        assert!(matches!(err, DevPkiError::Io { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("a-file/pki"), "{text}");
        assert!(!text.contains("parse"), "{text}");
    }

    #[test]
    fn go_cipher_names_map_to_rustls() {
        let names: Vec<String> = [
            "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
            "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
            "TLS_RSA_WITH_AES_128_CBC_SHA",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let (chosen, unsupported) = select_cipher_suites(&names);
        assert_eq!(chosen.len(), 2);
        assert_eq!(unsupported, ["TLS_RSA_WITH_AES_128_CBC_SHA"]);
    }

    #[test]
    fn dev_pki_loads_as_server_config() {
        let dir = tempfile::tempdir().unwrap();
        let (pki, generated) = DevPki::ensure(dir.path()).unwrap();
        assert!(generated);
        let (_, again) = DevPki::ensure(dir.path()).unwrap();
        assert!(!again, "an existing PKI is kept");
        let files = TlsFiles {
            cert: &pki.server_cert,
            key: &pki.server_key,
            client_ca: Some(&pki.ca_cert),
        };
        let policy = TlsPolicy {
            cipher_suites: &[],
            min_version: TlsVersion::Tls12,
        };
        let config = server_config(&files, &policy, &[b"h2"]).unwrap();
        assert_eq!(config.alpn_protocols, vec![b"h2".to_vec()]);
    }
}
