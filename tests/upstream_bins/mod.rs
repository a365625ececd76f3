//! The upstream Go binaries the interop harness builds (tests/interop/build.sh, cached outside
//! the work tree), for test binaries that run them as processes.

use std::path::PathBuf;
use std::process::Command;

/// Their directory: `$UPSTREAM_BIN_DIR`, else the one build.sh prints last. None (the caller
/// skips) without Go, except under CI=true, where that fails.
pub fn dir(what: &str) -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("UPSTREAM_BIN_DIR") {
        return Some(PathBuf::from(dir));
    }
    if Command::new("go").arg("version").output().is_err() {
        let ci = std::env::var("CI").is_ok_and(|v| v == "true");
        assert!(!ci, "CI=true: Go is needed to build {what}");
        eprintln!("SKIPPED: Go is not installed; cannot build {what}");
        return None;
    }
    let out = Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/interop/build.sh"
        ))
        .output()
        .expect("bash runs build.sh");
    assert!(
        out.status.success(),
        "tests/interop/build.sh failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout
        .lines()
        .last()
        .expect("build.sh prints its directory");
    Some(PathBuf::from(last.trim()))
}

/// Upstream's proxy-test-client, ready to take its arguments. Its UDS dialer closes the proxy
/// connection on any signal, SIGURG included, which the Go runtime sends itself to preempt a
/// long-running goroutine: with async preemption off, a busy machine cannot fail its request
/// (see packaging/upstream-test-client.sh).
#[allow(dead_code)] // not every test binary runs the client
pub fn test_client(dir: &std::path::Path) -> Command {
    let mut cmd = Command::new(dir.join("proxy-test-client"));
    cmd.env("GODEBUG", "asyncpreemptoff=1");
    cmd
}
