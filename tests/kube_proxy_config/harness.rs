//! Runs the kube-proxy binary and reads the fixtures.

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/kube-proxy")
        .join(name)
}

pub fn read_fixture(name: &str) -> String {
    std::fs::read_to_string(fixture(name)).unwrap()
}

/// Runs kube-proxy with these arguments in a network namespace of its own: a command line that
/// unexpectedly starts the proxy programs that namespace, never the machine's.
pub fn run(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut command = Command::new("unshare");
    command.args(["--net", "--", env!("CARGO_BIN_EXE_kube-proxy")]);
    command.args(args);
    for (name, _) in std::env::vars() {
        if name.starts_with("KUBE_PROXY_") {
            command.env_remove(name);
        }
    }
    for (k, v) in env {
        command.env(k, v);
    }
    let out = command.output().expect("run kube-proxy");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// The configuration ours writes for these arguments (`--write-config-to` into a temp file).
pub fn written(args: &[&str], env: &[(&str, &str)], name: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join(name);
    let target = format!("--write-config-to={}", out.display());
    let mut all = args.to_vec();
    all.push(&target);
    let result = run(&all, env);
    assert_eq!(result.code, 0, "{args:?}: {}", result.stderr);
    std::fs::read_to_string(out).unwrap()
}

pub fn temp_file(name: &str, text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    (dir, path)
}
