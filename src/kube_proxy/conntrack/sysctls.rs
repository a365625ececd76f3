//! The conntrack sysctls kube-proxy sets at start-up, in every mode (upstream's
//! `pkg/proxy/conntrack/sysctls.go`): the table's size and hash size, then five timeouts
//! and TCP liberal mode. A write that fails is fatal to upstream's start-up, so it is an
//! error here; the caller decides.
//!
//! Inside a container or a network namespace other than the host's, `nf_conntrack_max` and
//! the hash size cannot be written: such deployments pass `max_per_core: 0`.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The table size is capped there, whatever the CPU count, so that a large machine does not
/// give most of its memory to conntrack.
const MAX_LIMIT: i64 = 1_048_576;

/// What the `conntrack` section of kube-proxy's configuration says. Zero (or false) leaves
/// a setting as the kernel has it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConntrackSettings {
    /// Entries per CPU; 0 leaves `nf_conntrack_max` and the hash size alone.
    pub max_per_core: i32,
    /// The floor of `nf_conntrack_max` when `max_per_core` asks for less.
    pub min: i32,
    pub tcp_established: Duration,
    pub tcp_close_wait: Duration,
    /// Sets `nf_conntrack_tcp_be_liberal` to 1 (false leaves it alone).
    pub tcp_be_liberal: bool,
    pub udp_timeout: Duration,
    pub udp_stream_timeout: Duration,
}

/// Where `/proc` and `/sys` are: the real ones, or a test's directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelRoots {
    pub proc: PathBuf,
    pub sys: PathBuf,
}

impl Default for KernelRoots {
    fn default() -> KernelRoots {
        KernelRoots {
            proc: PathBuf::from("/proc"),
            sys: PathBuf::from("/sys"),
        }
    }
}

impl KernelRoots {
    /// `/proc/sys/<entry>`, with upstream's slash-separated entry name.
    fn sysctl(&self, entry: &str) -> PathBuf {
        self.proc.join("sys").join(entry)
    }

    fn hashsize(&self) -> PathBuf {
        self.sys.join("module/nf_conntrack/parameters/hashsize")
    }

    fn online_cpus(&self) -> PathBuf {
        self.sys.join("devices/system/cpu/online")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SysctlError {
    #[error("reading {path}: {source}", path = .path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} holds {text:?}, not an integer", path = .path.display())]
    NotAnInteger { path: PathBuf, text: String },
    #[error("writing {value} to {path}: {source}", path = .path.display())]
    Write {
        path: PathBuf,
        value: i64,
        #[source]
        source: io::Error,
    },
}

/// Applies `settings` as upstream does: the table size only upwards, each other value only
/// when it differs from the kernel's, each write logged.
pub fn set_sysctls(settings: &ConntrackSettings, roots: &KernelRoots) -> Result<(), SysctlError> {
    let max = conntrack_max(settings, cpu_count(roots));
    if max > 0 {
        // A maximum that cannot be read is written, as upstream's.
        let current = read_int(&roots.sysctl("net/netfilter/nf_conntrack_max"), sysctl_trim);
        if !matches!(current, Ok(current) if current >= max) {
            set_sysctl(roots, "nf_conntrack_max", max)?;
        }
        let path = roots.hashsize();
        let hashsize = read_int(&path, char::is_whitespace)?;
        if hashsize < max / 4 {
            tracing::info!(conntrackHashsize = max / 4, "Setting conntrack hashsize");
            write_int(&path, max / 4)?;
        }
    }
    let timeouts = [
        (
            "nf_conntrack_tcp_timeout_established",
            settings.tcp_established,
        ),
        (
            "nf_conntrack_tcp_timeout_close_wait",
            settings.tcp_close_wait,
        ),
    ];
    for (name, timeout) in timeouts {
        if !timeout.is_zero() {
            set_sysctl(roots, name, seconds(timeout))?;
        }
    }
    if settings.tcp_be_liberal {
        set_sysctl(roots, "nf_conntrack_tcp_be_liberal", 1)?;
    }
    let timeouts = [
        ("nf_conntrack_udp_timeout", settings.udp_timeout),
        (
            "nf_conntrack_udp_timeout_stream",
            settings.udp_stream_timeout,
        ),
    ];
    for (name, timeout) in timeouts {
        if !timeout.is_zero() {
            set_sysctl(roots, name, seconds(timeout))?;
        }
    }
    Ok(())
}

/// The table size wanted: `max_per_core` × CPUs, capped at `MAX_LIMIT`, and at least `min`
/// (the cap applies before the floor, as upstream's); 0 when `max_per_core` is not positive.
pub fn conntrack_max(settings: &ConntrackSettings, cpus: usize) -> i64 {
    if settings.max_per_core <= 0 {
        return 0;
    }
    let floor = i64::from(settings.min);
    let cpus = i64::try_from(cpus).unwrap_or(i64::MAX);
    let scaled = i64::from(settings.max_per_core).saturating_mul(cpus);
    if scaled > MAX_LIMIT {
        tracing::info!(
            v = 3,
            scaled,
            limit = MAX_LIMIT,
            "GetConntrackMax: capping scaled conntrack-max-per-core"
        );
        return MAX_LIMIT;
    }
    if scaled > floor {
        tracing::info!(
            v = 3,
            "GetConntrackMax: using scaled conntrack-max-per-core"
        );
        return scaled;
    }
    tracing::info!(v = 3, "GetConntrackMax: using conntrack-min");
    floor
}

/// The node's online CPUs (the table is node-wide, so not this process's cpuset), from sysfs;
/// the CPUs this process may use when sysfs cannot say.
fn cpu_count(roots: &KernelRoots) -> usize {
    std::fs::read_to_string(roots.online_cpus())
        .ok()
        .and_then(|list| count_cpu_list(list.trim()))
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// The size of a kernel CPU list (`0-3,8,10-11`); None when it does not parse.
fn count_cpu_list(list: &str) -> Option<usize> {
    if list.is_empty() {
        return Some(0);
    }
    list.split(',').try_fold(0usize, |count, range| {
        let (first, last) = match range.split_once('-') {
            Some((first, last)) => (first.parse::<usize>().ok()?, last.parse::<usize>().ok()?),
            None => {
                let cpu = range.parse::<usize>().ok()?;
                (cpu, cpu)
            }
        };
        (first <= last).then(|| count + (last - first + 1))
    })
}

/// Whole seconds, truncated as Go's `int(d / time.Second)`.
fn seconds(timeout: Duration) -> i64 {
    i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX)
}

/// What Go's sysctl reader trims around a value.
fn sysctl_trim(c: char) -> bool {
    c == ' ' || c == '\n'
}

/// Writes `net/netfilter/<name>` when it does not already hold `value` (or cannot be read).
fn set_sysctl(roots: &KernelRoots, name: &str, value: i64) -> Result<(), SysctlError> {
    let entry = format!("net/netfilter/{name}");
    let path = roots.sysctl(&entry);
    if read_int(&path, sysctl_trim).ok() == Some(value) {
        return Ok(());
    }
    tracing::info!(entry = %entry, value, "Set sysctl");
    write_int(&path, value)
}

fn read_int(path: &Path, trim: fn(char) -> bool) -> Result<i64, SysctlError> {
    let text = std::fs::read_to_string(path).map_err(|source| SysctlError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    text.trim_matches(trim)
        .parse()
        .map_err(|_| SysctlError::NotAnInteger {
            path: path.to_path_buf(),
            text,
        })
}

fn write_int(path: &Path, value: i64) -> Result<(), SysctlError> {
    std::fs::write(path, value.to_string()).map_err(|source| SysctlError::Write {
        path: path.to_path_buf(),
        value,
        source,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex, MutexGuard};

    use super::*;

    /// Held by every test that logs through this file's callsites. tracing caches whether a
    /// callsite is wanted when it is first hit: a test thread hitting one while the capturing
    /// subscriber is being set up could cache "no one wants it" and hide the lines the log
    /// test checks.
    static SERIAL: Mutex<()> = Mutex::new(());

    fn serial() -> MutexGuard<'static, ()> {
        SERIAL
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A /proc and /sys in a temp dir, with the files upstream reads.
    struct Kernel {
        _dir: tempfile::TempDir,
        roots: KernelRoots,
    }

    impl Kernel {
        fn new(cpus: &str) -> Kernel {
            let dir = tempfile::tempdir().unwrap();
            let roots = KernelRoots {
                proc: dir.path().join("proc"),
                sys: dir.path().join("sys"),
            };
            std::fs::create_dir_all(roots.sysctl("net/netfilter")).unwrap();
            std::fs::create_dir_all(roots.hashsize().parent().unwrap()).unwrap();
            std::fs::create_dir_all(roots.online_cpus().parent().unwrap()).unwrap();
            std::fs::write(roots.online_cpus(), format!("{cpus}\n")).unwrap();
            Kernel { _dir: dir, roots }
        }

        /// The kernel writes values with a newline; ours are written without one, so a file
        /// that still ends in a newline was not written.
        fn set(&self, name: &str, value: i64) {
            std::fs::write(self.netfilter(name), format!("{value}\n")).unwrap();
        }

        fn netfilter(&self, name: &str) -> PathBuf {
            self.roots.sysctl(&format!("net/netfilter/{name}"))
        }

        fn read(&self, name: &str) -> String {
            std::fs::read_to_string(self.netfilter(name)).unwrap()
        }

        fn hashsize(&self) -> String {
            std::fs::read_to_string(self.roots.hashsize()).unwrap()
        }
    }

    fn settings() -> ConntrackSettings {
        ConntrackSettings {
            max_per_core: 32768,
            min: 131072,
            tcp_established: Duration::from_secs(86400),
            tcp_close_wait: Duration::from_secs(3600),
            tcp_be_liberal: true,
            udp_timeout: Duration::ZERO,
            udp_stream_timeout: Duration::from_secs(120),
        }
    }

    /// A kernel as booted: small table, other defaults.
    fn booted(cpus: &str) -> Kernel {
        let kernel = Kernel::new(cpus);
        kernel.set("nf_conntrack_max", 65536);
        std::fs::write(kernel.roots.hashsize(), "16384\n").unwrap();
        kernel.set("nf_conntrack_tcp_timeout_established", 432000);
        kernel.set("nf_conntrack_tcp_timeout_close_wait", 3600);
        kernel.set("nf_conntrack_tcp_be_liberal", 0);
        kernel.set("nf_conntrack_udp_timeout", 30);
        kernel.set("nf_conntrack_udp_timeout_stream", 120);
        kernel
    }

    #[test]
    fn the_table_size_scales_with_cpus_between_floor_and_cap() {
        let _serial = serial();
        let with = |max_per_core, min| ConntrackSettings {
            max_per_core,
            min,
            ..ConntrackSettings::default()
        };
        #[rustfmt::skip]
        let cases = [
            (with(0, 131072), 4, 0),
            (with(-1, 131072), 4, 0),
            (with(32768, 131072), 2, 131072),
            (with(32768, 131072), 4, 131072),
            (with(32768, 131072), 8, 262144),
            (with(32768, 0), 64, MAX_LIMIT),
            // The cap comes first: a floor above it is only reached when scaling asks less.
            (with(32768, 2_000_000), 64, MAX_LIMIT),
            (with(10, 2_000_000), 4, 2_000_000),
            (with(i32::MAX, 0), usize::MAX, MAX_LIMIT),
        ];
        for (settings, cpus, expected) in cases {
            assert_eq!(
                conntrack_max(&settings, cpus),
                expected,
                "{settings:?} on {cpus} CPUs"
            );
        }
    }

    #[test]
    fn cpu_lists_count_as_the_kernel_writes_them() {
        assert_eq!(count_cpu_list("0-1"), Some(2));
        assert_eq!(count_cpu_list("0"), Some(1));
        assert_eq!(count_cpu_list("0-3,8,10-11"), Some(7));
        assert_eq!(count_cpu_list("3-1"), None);
        assert_eq!(count_cpu_list("x"), None);
        let kernel = Kernel::new("0-5");
        assert_eq!(cpu_count(&kernel.roots), 6);
        std::fs::write(kernel.roots.online_cpus(), "garbage").unwrap();
        assert!(cpu_count(&kernel.roots) >= 1);
    }

    #[test]
    fn values_that_differ_are_written_and_the_others_left_alone() {
        let _serial = serial();
        let kernel = booted("0-7");
        set_sysctls(&settings(), &kernel.roots).unwrap();
        assert_eq!(kernel.read("nf_conntrack_max"), "262144");
        assert_eq!(kernel.hashsize(), "65536");
        assert_eq!(kernel.read("nf_conntrack_tcp_timeout_established"), "86400");
        assert_eq!(kernel.read("nf_conntrack_tcp_be_liberal"), "1");
        // Already as wanted:
        assert_eq!(kernel.read("nf_conntrack_tcp_timeout_close_wait"), "3600\n");
        assert_eq!(kernel.read("nf_conntrack_udp_timeout_stream"), "120\n");
        // Zero: left as the kernel has it.
        assert_eq!(kernel.read("nf_conntrack_udp_timeout"), "30\n");
    }

    #[test]
    fn the_table_and_its_hash_only_grow() {
        let _serial = serial();
        let kernel = booted("0-7");
        kernel.set("nf_conntrack_max", 500_000);
        std::fs::write(kernel.roots.hashsize(), "131072\n").unwrap();
        set_sysctls(&settings(), &kernel.roots).unwrap();
        assert_eq!(kernel.read("nf_conntrack_max"), "500000\n");
        assert_eq!(kernel.hashsize(), "131072\n");

        // A larger table with a hash already large enough: only the table grows.
        kernel.set("nf_conntrack_max", 65536);
        std::fs::write(kernel.roots.hashsize(), "65536\n").unwrap();
        set_sysctls(&settings(), &kernel.roots).unwrap();
        assert_eq!(kernel.read("nf_conntrack_max"), "262144");
        assert_eq!(kernel.hashsize(), "65536\n");
    }

    #[test]
    fn no_max_per_core_leaves_the_table_alone() {
        let _serial = serial();
        let kernel = booted("0-7");
        std::fs::remove_file(kernel.roots.hashsize()).unwrap();
        let settings = ConntrackSettings {
            max_per_core: 0,
            ..settings()
        };
        set_sysctls(&settings, &kernel.roots).unwrap();
        assert_eq!(kernel.read("nf_conntrack_max"), "65536\n");
        assert_eq!(kernel.read("nf_conntrack_tcp_be_liberal"), "1");
    }

    #[test]
    fn an_unreadable_maximum_is_written() {
        let _serial = serial();
        let kernel = booted("0-7");
        std::fs::write(kernel.netfilter("nf_conntrack_max"), "n/a\n").unwrap();
        set_sysctls(&settings(), &kernel.roots).unwrap();
        assert_eq!(kernel.read("nf_conntrack_max"), "262144");
    }

    #[test]
    fn failures_name_their_file() {
        let _serial = serial();
        // No hash size to read: fatal when the table is sized.
        let kernel = booted("0-7");
        std::fs::remove_file(kernel.roots.hashsize()).unwrap();
        let err = set_sysctls(&settings(), &kernel.roots).unwrap_err();
        assert!(matches!(&err, SysctlError::Read { path, .. } if *path == kernel.roots.hashsize()));
        assert!(
            err.to_string().contains("nf_conntrack/parameters/hashsize"),
            "{err}"
        );

        // A sysctl that cannot be written (a directory stands in for a read-only file, which
        // root could still write).
        let kernel = booted("0-7");
        let liberal = kernel.netfilter("nf_conntrack_tcp_be_liberal");
        std::fs::remove_file(&liberal).unwrap();
        std::fs::create_dir(&liberal).unwrap();
        let err = set_sysctls(&settings(), &kernel.roots).unwrap_err();
        assert!(
            matches!(&err, SysctlError::Write { path, value: 1, .. } if *path == liberal),
            "{err:?}"
        );
        assert!(
            err.to_string().contains("nf_conntrack_tcp_be_liberal"),
            "{err}"
        );
        // What came before the failure was written; what comes after was not tried.
        assert_eq!(kernel.read("nf_conntrack_tcp_timeout_established"), "86400");
        assert_eq!(kernel.read("nf_conntrack_udp_timeout_stream"), "120\n");
    }

    #[test]
    fn timeouts_are_whole_seconds_as_upstream_truncates_them() {
        let _serial = serial();
        let kernel = booted("0-7");
        let settings = ConntrackSettings {
            max_per_core: 0,
            tcp_established: Duration::from_millis(86_400_900),
            // Not zero, so written, as upstream's: as 0 seconds.
            udp_timeout: Duration::from_millis(500),
            ..settings()
        };
        set_sysctls(&settings, &kernel.roots).unwrap();
        assert_eq!(kernel.read("nf_conntrack_tcp_timeout_established"), "86400");
        assert_eq!(kernel.read("nf_conntrack_udp_timeout"), "0");
    }

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl io::Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn each_write_is_logged_as_upstream_logs_it() {
        let _serial = serial();
        let kernel = booted("0-7");
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = crate::logging::klog_subscriber(4, "", move || writer.clone());
        tracing::subscriber::with_default(subscriber, || {
            set_sysctls(&settings(), &kernel.roots).unwrap();
        });
        let log = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = log
            .lines()
            .filter_map(|line| line.split_once("] ").map(|(_, rest)| rest))
            .collect();
        assert_eq!(
            lines,
            [
                r#""GetConntrackMax: using scaled conntrack-max-per-core""#,
                r#""Set sysctl" entry="net/netfilter/nf_conntrack_max" value=262144"#,
                r#""Setting conntrack hashsize" conntrackHashsize=65536"#,
                r#""Set sysctl" entry="net/netfilter/nf_conntrack_tcp_timeout_established" value=86400"#,
                r#""Set sysctl" entry="net/netfilter/nf_conntrack_tcp_be_liberal" value=1"#,
            ],
            "{log}"
        );
    }
}
