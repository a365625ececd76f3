//! TLS parity with the Go server: RSA and ECDSA keys in PKCS#1, PKCS#8 and SEC1 PEM, chains
//! with intermediates, Go cipher-suite names and minimum versions, each proven by a handshake.
//! Keys and certificates are made with the openssl command line, as operators make them.
#![allow(clippy::unwrap_used)] // tests and benchmarks fail loudly by design

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use kube_traffic::config::TlsVersion;
use kube_traffic::tls::{self, TlsError, TlsFiles, TlsPolicy};
use tokio::net::{TcpListener, TcpStream};

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A root CA, an intermediate signed by it, and a way to issue leaves from the intermediate.
struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    fn new() -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(
            d.join("ca.ext"),
            "basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n",
        )
        .unwrap();
        openssl(
            d,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "30",
                "-subj",
                "/CN=root",
                "-keyout",
                "root.key",
                "-out",
                "root.crt",
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        );
        openssl(
            d,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-subj",
                "/CN=intermediate",
                "-keyout",
                "int.key",
                "-out",
                "int.csr",
            ],
        );
        openssl(
            d,
            &[
                "x509",
                "-req",
                "-in",
                "int.csr",
                "-CA",
                "root.crt",
                "-CAkey",
                "root.key",
                "-CAcreateserial",
                "-days",
                "30",
                "-extfile",
                "ca.ext",
                "-out",
                "int.crt",
            ],
        );
        std::fs::write(
            d.join("leaf.ext"),
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        Pki { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Issues a leaf for `key` (already written as `key_file`); returns the chain file
    /// (leaf then intermediate).
    fn issue(&self, name: &str, key_file: &str) -> PathBuf {
        let d = self.dir.path();
        let csr = format!("{name}.csr");
        openssl(
            d,
            &[
                "req",
                "-new",
                "-key",
                key_file,
                "-subj",
                "/CN=localhost",
                "-out",
                &csr,
            ],
        );
        let crt = format!("{name}.crt");
        openssl(
            d,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "int.crt",
                "-CAkey",
                "int.key",
                "-CAcreateserial",
                "-days",
                "30",
                "-extfile",
                "leaf.ext",
                "-out",
                &crt,
            ],
        );
        let chain = format!(
            "{}{}",
            std::fs::read_to_string(d.join(&crt)).unwrap(),
            std::fs::read_to_string(d.join("int.crt")).unwrap()
        );
        let path = d.join(format!("{name}.chain.crt"));
        std::fs::write(&path, chain).unwrap();
        path
    }
}

/// Writes a P-256 key in SEC1 PEM.
fn ec_key(pki: &Pki, file: &str) {
    openssl(
        pki.dir.path(),
        &[
            "ecparam",
            "-name",
            "prime256v1",
            "-genkey",
            "-noout",
            "-out",
            file,
        ],
    );
}

fn key_header(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .to_string()
}

fn client(root: &Path, max_tls12: bool) -> tokio_rustls::TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for cert in tls::load_certs(root).unwrap() {
        roots.add(cert).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let versions: &[&rustls::SupportedProtocolVersion] = if max_tls12 {
        &[&rustls::version::TLS12]
    } else {
        &[&rustls::version::TLS12, &rustls::version::TLS13]
    };
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// Serves one handshake with `server` and returns the client's view of it.
async fn handshake(
    server: Arc<rustls::ServerConfig>,
    connector: tokio_rustls::TlsConnector,
) -> Result<(rustls::ProtocolVersion, rustls::CipherSuite, Vec<u8>), String> {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(server);
    let serve = tokio::spawn(async move {
        let (sock, _) = listener.accept().await.unwrap();
        let _ = acceptor.accept(sock).await;
    });
    let sock = TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let result = connector
        .connect(name, sock)
        .await
        .map_err(|e| e.to_string());
    let _ = serve.await;
    let stream = result?;
    let (_, conn) = stream.get_ref();
    Ok((
        conn.protocol_version().unwrap(),
        conn.negotiated_cipher_suite().unwrap().suite(),
        conn.alpn_protocol().unwrap_or_default().to_vec(),
    ))
}

fn policy(suites: &[String], min: TlsVersion) -> TlsPolicy<'_> {
    TlsPolicy {
        cipher_suites: suites,
        min_version: min,
    }
}

#[tokio::test]
async fn every_key_format_and_an_intermediate_chain_serve_a_handshake() {
    let pki = Pki::new();
    let d = pki.dir.path();
    let keys: [(&str, &[&[&str]], &str); 5] = [
        (
            "rsa-pkcs1",
            &[&["genrsa", "-traditional", "-out", "rsa-pkcs1.key", "2048"]],
            "-----BEGIN RSA PRIVATE KEY-----",
        ),
        (
            "rsa-pkcs8",
            &[&[
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
                "-out",
                "rsa-pkcs8.key",
            ]],
            "-----BEGIN PRIVATE KEY-----",
        ),
        (
            "p256-sec1",
            &[&[
                "ecparam",
                "-name",
                "prime256v1",
                "-genkey",
                "-noout",
                "-out",
                "p256-sec1.key",
            ]],
            "-----BEGIN EC PRIVATE KEY-----",
        ),
        (
            "p384-sec1",
            &[&[
                "ecparam",
                "-name",
                "secp384r1",
                "-genkey",
                "-noout",
                "-out",
                "p384-sec1.key",
            ]],
            "-----BEGIN EC PRIVATE KEY-----",
        ),
        (
            "p256-pkcs8",
            &[
                &[
                    "ecparam",
                    "-name",
                    "prime256v1",
                    "-genkey",
                    "-noout",
                    "-out",
                    "p256-tmp.key",
                ],
                &[
                    "pkcs8",
                    "-topk8",
                    "-nocrypt",
                    "-in",
                    "p256-tmp.key",
                    "-out",
                    "p256-pkcs8.key",
                ],
            ],
            "-----BEGIN PRIVATE KEY-----",
        ),
    ];
    for (name, steps, header) in keys {
        for step in steps {
            openssl(d, step);
        }
        let key = pki.path(&format!("{name}.key"));
        assert_eq!(key_header(&key), header, "{name} is in the intended format");
        let chain = pki.issue(name, &format!("{name}.key"));
        let files = TlsFiles {
            cert: &chain,
            key: &key,
            client_ca: None,
        };
        let server = tls::server_config(&files, &policy(&[], TlsVersion::Tls12), &[b"h2"])
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        // The client trusts only the root: the intermediate must come from the chain file.
        let (_, _, alpn) = handshake(server, client(&pki.path("root.crt"), false))
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(alpn, b"h2", "{name}: ALPN h2 negotiated");
    }
}

#[tokio::test]
async fn cipher_suites_by_go_name_and_the_tls_floor() {
    let pki = Pki::new();
    ec_key(&pki, "ec.key");
    let chain = pki.issue("ec", "ec.key");
    let key = pki.path("ec.key");
    let files = TlsFiles {
        cert: &chain,
        key: &key,
        client_ca: None,
    };
    let root = pki.path("root.crt");

    // A Go name rustls implements is applied; CBC is warned about and ignored.
    let suites = vec![
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384".to_string(),
        "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA".to_string(),
    ];
    let server = tls::server_config(&files, &policy(&suites, TlsVersion::Tls12), &[b"h2"]).unwrap();
    let (version, suite, _) = handshake(server, client(&root, true)).await.unwrap();
    assert_eq!(version, rustls::ProtocolVersion::TLSv1_2);
    assert_eq!(
        suite,
        rustls::CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384
    );

    // Only names rustls lacks: no TLS 1.2 suite remains, so startup fails, naming them.
    let cbc_only = vec![
        "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA".to_string(),
        "TLS_RSA_WITH_AES_128_GCM_SHA256".to_string(),
    ];
    match tls::server_config(&files, &policy(&cbc_only, TlsVersion::Tls12), &[b"h2"]) {
        Err(TlsError::NoCipherSuite(names)) => assert_eq!(names, cbc_only),
        other => panic!("expected NoCipherSuite, got {:?}", other.map(|_| ())),
    }

    // VersionTLS13 refuses a TLS 1.2-only client; VersionTLS10 still offers 1.2 (the floor).
    let tls13 = tls::server_config(&files, &policy(&[], TlsVersion::Tls13), &[b"h2"]).unwrap();
    assert!(handshake(tls13, client(&root, true)).await.is_err());
    let tls10 = tls::server_config(&files, &policy(&[], TlsVersion::Tls10), &[b"h2"]).unwrap();
    let (version, _, _) = handshake(tls10, client(&root, true)).await.unwrap();
    assert_eq!(version, rustls::ProtocolVersion::TLSv1_2);
}

#[tokio::test]
async fn a_key_that_does_not_match_its_certificate_is_refused() {
    let pki = Pki::new();
    ec_key(&pki, "a.key");
    ec_key(&pki, "b.key");
    let chain = pki.issue("a", "a.key");
    let other = pki.path("b.key");
    let files = TlsFiles {
        cert: &chain,
        key: &other,
        client_ca: None,
    };
    assert!(matches!(
        tls::server_config(&files, &policy(&[], TlsVersion::Tls12), &[b"h2"]),
        Err(TlsError::Pair { .. })
    ));
}

#[tokio::test]
async fn a_cipher_list_of_only_tls13_names_serves_tls13_alone() {
    let pki = Pki::new();
    ec_key(&pki, "ec.key");
    let chain = pki.issue("ec", "ec.key");
    let key = pki.path("ec.key");
    let files = TlsFiles {
        cert: &chain,
        key: &key,
        client_ca: None,
    };
    let root = pki.path("root.crt");
    // As Go: TLS 1.3 names are accepted and change nothing, and no TLS 1.2 suite is left,
    // so TLS 1.3 clients connect and TLS 1.2 clients do not.
    let suites = vec![
        "TLS_AES_128_GCM_SHA256".to_string(),
        "TLS_CHACHA20_POLY1305_SHA256".to_string(),
    ];
    let server = tls::server_config(&files, &policy(&suites, TlsVersion::Tls12), &[b"h2"])
        .expect("a TLS 1.3-only list is not an error");
    let (version, _, alpn) = handshake(server.clone(), client(&root, false))
        .await
        .unwrap();
    assert_eq!(version, rustls::ProtocolVersion::TLSv1_3);
    assert_eq!(alpn, b"h2");
    assert!(handshake(server, client(&root, true)).await.is_err());
}

#[test]
fn a_tls_error_names_its_cause_once() {
    let pki = Pki::new();
    let not_pem = pki.path("not.pem");
    std::fs::write(&not_pem, "not a certificate").unwrap();
    ec_key(&pki, "ec.key");
    let key = pki.path("ec.key");
    let cert = pki.path("root.crt");
    for (cert, key) in [(&not_pem, &key), (&cert, &not_pem)] {
        let files = TlsFiles {
            cert,
            key,
            client_ca: None,
        };
        let err = tls::server_config(&files, &policy(&[], TlsVersion::Tls12), &[b"h2"])
            .expect_err("refused");
        let plain = err.to_string();
        let chain = format!("{:#}", anyhow::Error::from(err));
        assert_eq!(
            chain, plain,
            "the chain adds nothing the message does not say"
        );
        assert_eq!(
            plain.matches(&*not_pem.display().to_string()).count(),
            1,
            "{plain}"
        );
    }
}
