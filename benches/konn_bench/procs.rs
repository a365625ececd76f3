//! Child processes (killed with the tool), their CPU and memory from /proc, and free ports.

use std::collections::HashSet;
use std::net::TcpListener as StdTcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{bail, Context, Result};

pub struct Proc {
    pub name: String,
    pub child: Child,
    pub log: PathBuf,
}

impl Proc {
    pub fn spawn(name: &str, bin: &Path, args: &[String], log: &Path) -> Result<Proc> {
        let f = std::fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(f.try_clone()?)
            .stderr(f);
        set_pdeathsig(&mut cmd);
        let child = cmd
            .spawn()
            .with_context(|| format!("spawn {name} ({})", bin.display()))?;
        Ok(Proc {
            name: name.to_string(),
            child,
            log: log.to_path_buf(),
        })
    }
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
    pub fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(st)) => Some(st.to_string()),
            Ok(None) => None,
            Err(e) => Some(e.to_string()),
        }
    }
    pub fn tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
    pub fn log_contains(&self, s: &str) -> bool {
        std::fs::read_to_string(&self.log)
            .map(|t| t.contains(s))
            .unwrap_or(false)
    }
}

impl Drop for Proc {
    #[allow(unsafe_code)] // a documented site: see the SAFETY note
    fn drop(&mut self) {
        // SAFETY: plain kill(2) on the process group this child leads (setpgid in pre_exec).
        unsafe {
            libc::kill(-(self.child.id() as libc::pid_t), libc::SIGKILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[allow(unsafe_code)] // a documented site: see the SAFETY note
pub fn set_pdeathsig(cmd: &mut Command) {
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Its own process group, so a wrapper's children die with it (see Drop).
            if libc::setpgid(0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// utime+stime of a process in seconds (all threads).
pub fn cpu_secs(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return f64::NAN;
    };
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
        return f64::NAN;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After "pid (comm) ": state is field 3, utime 14, stime 15.
    let ut: f64 = f.get(11).and_then(|s| s.parse().ok()).unwrap_or(f64::NAN);
    let st: f64 = f.get(12).and_then(|s| s.parse().ok()).unwrap_or(f64::NAN);
    (ut + st) / clk_tck()
}

pub fn self_cpu_secs() -> f64 {
    cpu_secs(std::process::id())
}

#[allow(unsafe_code)] // a documented site: see the SAFETY note
pub fn clk_tck() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// A field of /proc/<pid>/status in KiB (VmRSS, VmHWM).
pub fn status_kib(pid: u32, field: &str) -> f64 {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return f64::NAN;
    };
    for line in s.lines() {
        if let Some(rest) = line.strip_prefix(field).and_then(|r| r.strip_prefix(':')) {
            return rest
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .unwrap_or(f64::NAN);
        }
    }
    f64::NAN
}

// ============================================================================ ports, certs

pub struct Ports {
    pub used: HashSet<u16>,
    pub rng: fastrand::Rng,
}

impl Ports {
    /// A free port in [1024, 32767] on 127.0.0.1 (bind-checked, then released), never handed
    /// out twice in one invocation.
    pub fn alloc(&mut self) -> Result<u16> {
        for _ in 0..2000 {
            let p = self.rng.u16(1024..=32767);
            if self.used.contains(&p) {
                continue;
            }
            if StdTcpListener::bind(("127.0.0.1", p)).is_ok() {
                self.used.insert(p);
                return Ok(p);
            }
        }
        bail!("no free port in [1024, 32767]")
    }
}
