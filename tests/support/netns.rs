//! A network namespace of a test's own, removed when dropped (also when the test fails),
//! and commands run inside it.

use std::io::Write;
use std::process::{Command, Stdio};

/// Whether this machine can run a namespace test: root, `ip` and `nft`. Without them the
/// test is skipped, except under CI=true, where it fails.
pub fn can_run(test: &str) -> bool {
    let root = nix_uid_is_root();
    let tools = ["ip", "nft"].iter().all(|t| {
        Command::new(t)
            .arg("-V")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok()
    });
    if root && tools {
        return true;
    }
    let why = if root {
        "`ip` or `nft` is missing"
    } else {
        "not root"
    };
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{test} cannot run here ({why}), and CI=true");
    }
    eprintln!("skipping {test}: {why}");
    false
}

fn nix_uid_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

pub struct Netns {
    name: String,
}

impl Netns {
    /// `kt<pid>-<tag>`: unique per test process.
    pub fn new(tag: &str) -> std::io::Result<Netns> {
        let name = format!("kt{}-{tag}", std::process::id());
        let status = Command::new("ip").args(["netns", "add", &name]).status()?;
        if !status.success() {
            return Err(std::io::Error::other(format!("ip netns add {name} failed")));
        }
        Ok(Netns { name })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `nft ARGS` inside the namespace; its stdout, or its stderr as the error.
    pub fn nft(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.name, "nft"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// `nft -f -` with `text` inside the namespace.
    pub fn nft_stdin(&self, text: &str) -> Result<(), String> {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.name, "nft", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| e.to_string())?;
        child
            .stdin
            .take()
            .ok_or("no stdin")?
            .write_all(text.as_bytes())
            .map_err(|e| e.to_string())?;
        let out = child.wait_with_output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).into_owned());
        }
        Ok(())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .stderr(Stdio::null())
            .status();
    }
}
