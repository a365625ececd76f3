//! Commands and long-running processes, inside a network namespace or on the host.
//!
//! Every long-running process is a [`Proc`]: started in a process group of its own, stopped by
//! its recorded PID (the group it leads) when the guard drops, and started under
//! `setpriv --pdeathsig KILL` so that it dies with the test thread even when the test process
//! is killed and no destructor runs.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Runs a command to completion; its stdout, or an error that names the command and carries
/// its stderr.
pub fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program} {}: {e}", args.join(" ")))?;
    if !out.status.success() {
        return Err(format!(
            "{program} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// [`run`], panicking on failure: for set-up steps that have no reason to fail.
pub fn must(program: &str, args: &[&str]) -> String {
    run(program, args).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs a command inside network namespace `ns`.
pub fn ns_run(ns: &str, args: &[&str]) -> Result<String, String> {
    let mut all = vec!["netns", "exec", ns];
    all.extend_from_slice(args);
    run("ip", &all)
}

pub fn ns_must(ns: &str, args: &[&str]) -> String {
    ns_run(ns, args).unwrap_or_else(|e| panic!("{e}"))
}

/// A process this test started. Dropping it stops it: SIGTERM to its process group, then
/// SIGKILL after `grace`.
pub struct Proc {
    pub name: String,
    pub log: PathBuf,
    child: Child,
    grace: Duration,
    /// Stopped and reaped by [`Proc::stop`] or [`Proc::kill`]: its PID may be reused by
    /// now, so Drop must not signal it again.
    reaped: bool,
}

impl Proc {
    /// Starts `argv` (inside `ns` when given), its stdout and stderr appended to `log`.
    pub fn start(
        name: &str,
        ns: Option<&str>,
        argv: &[&str],
        env: &[(&str, &str)],
        log: &Path,
    ) -> Proc {
        let out = File::create(log).unwrap_or_else(|e| panic!("{}: {e}", log.display()));
        let err = out.try_clone().expect("dup log fd");
        // setpriv sets the parent-death signal and execs; `ip netns exec` execs too, so the
        // recorded PID is the program itself and the death signal survives (none of these
        // programs is set-uid or has file capabilities, which would clear it).
        let mut cmd = Command::new("setpriv");
        cmd.args(["--pdeathsig", "KILL"]);
        if let Some(ns) = ns {
            cmd.args(["ip", "netns", "exec", ns]);
        }
        cmd.args(argv)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            // Its own group, so that stopping it also stops what it forked (socat's
            // per-connection children).
            .process_group(0);
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name} ({}): {e}", argv.join(" ")));
        Proc {
            name: name.to_string(),
            log: log.to_path_buf(),
            child,
            grace: Duration::from_secs(5),
            reaped: false,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// None while it runs; its exit status once it has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits until its log contains `needle` (a readiness line), failing early if it exits.
    pub fn wait_for_log(&mut self, needle: &str, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            if text.contains(needle) {
                return Ok(());
            }
            if let Some(status) = self.exited() {
                return Err(format!(
                    "{} exited ({status}) before logging {needle:?}:\n{}",
                    self.name,
                    tail(&text, 20)
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{} did not log {needle:?} within {timeout:?}:\n{}",
                    self.name,
                    tail(&text, 20)
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The last `n` lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        tail(&std::fs::read_to_string(&self.log).unwrap_or_default(), n)
    }

    /// Sends `sig` ("-HUP", "-TERM") to the process itself (not its group).
    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status();
        assert!(
            status.is_ok_and(|s| s.success()),
            "kill {sig} {} ({})",
            self.child.id(),
            self.name
        );
    }

    /// Stops it as Drop does (SIGTERM, SIGKILL after the grace period) and returns how it
    /// exited; the guard is spent.
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        self.finish("-TERM")
    }

    /// SIGKILL at once (a crash, an OOM kill); the guard is spent.
    pub fn kill(&mut self) -> Option<std::process::ExitStatus> {
        self.finish("-KILL")
    }

    /// Waits up to `timeout` for it to exit by itself (after a signal the test sent).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = self.exited() {
                return Some(s);
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn finish(&mut self, sig: &str) -> Option<std::process::ExitStatus> {
        if self.reaped {
            return self.exited();
        }
        if self.exited().is_none() {
            self.signal_group(sig);
            let deadline = Instant::now() + self.grace;
            while self.exited().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        self.signal_group("-KILL");
        let status = self.child.wait().ok();
        self.reaped = true;
        status
    }

    fn signal_group(&self, sig: &str) {
        // The group id is the recorded PID (process_group(0) above).
        let _ = Command::new("kill")
            .args([sig, "--", &format!("-{}", self.child.id())])
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        if self.exited().is_none() {
            self.signal_group("-TERM");
            let deadline = Instant::now() + self.grace;
            while self.exited().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        // Also when the leader is gone: a forked child may still hold the group.
        self.signal_group("-KILL");
        let _ = self.child.wait();
    }
}

pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Polls `f` every `every` until it returns Some, or fails with `what` after `timeout`.
pub fn wait_until<T>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut f: impl FnMut() -> Option<T>,
) -> Result<T, String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if Instant::now() > deadline {
            return Err(format!("timed out after {timeout:?} waiting for {what}"));
        }
        std::thread::sleep(every);
    }
}
