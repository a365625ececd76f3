//! Logs: journald with structured fields when systemd runs us, readable stderr otherwise, and
//! a level filter that a reload can change.

use std::sync::OnceLock;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Layer, Registry};

use crate::config::LogFormat;

static FILTER: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();

/// klog verbosity to a tracing level: 0-4 info (upstream runs at 4), 5 debug, 6+ trace.
pub fn level_for_verbosity(verbosity: u32) -> &'static str {
    match verbosity {
        0..=4 => "info",
        5 => "debug",
        _ => "trace",
    }
}

/// The filter: RUST_LOG when set, else the -v level plus --vmodule's `module=N` entries
/// (module paths below the crate, e.g. `tunnel=6` or `backend::connect=5`).
pub fn log_filter(verbosity: u32, vmodule: &str) -> EnvFilter {
    if let Ok(filter) = EnvFilter::try_from_default_env() {
        return filter;
    }
    let mut directives = vec![format!(
        "warn,konnectivity_server={}",
        level_for_verbosity(verbosity)
    )];
    for entry in vmodule.split(',').filter(|e| !e.is_empty()) {
        if let Some((module, level)) = entry.split_once('=') {
            if let Ok(level) = level.trim().parse::<u32>() {
                directives.push(format!(
                    "konnectivity_server::{}={}",
                    module.trim().replace('/', "::"),
                    level_for_verbosity(level)
                ));
            }
        }
    }
    EnvFilter::new(directives.join(","))
}

/// klog's file output: `--log-file`, or `<--log-dir>/konnectivity-server.log`, used when
/// `--logtostderr=false` (klog ignores both otherwise). The file restarts empty once it
/// reaches `--log-file-max-size` MB (0: unlimited), so it cannot fill the disk.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileSink {
    pub path: std::path::PathBuf,
    pub max_bytes: u64,
    /// `--alsologtostderr`: also write to stderr.
    pub also_stderr: bool,
}

impl FileSink {
    pub fn from_klog(
        logtostderr: bool,
        log_file: &str,
        log_dir: &str,
        max_mb: u64,
        also: bool,
    ) -> Option<FileSink> {
        if logtostderr {
            return None;
        }
        let path = if !log_file.is_empty() {
            std::path::PathBuf::from(log_file)
        } else if !log_dir.is_empty() {
            std::path::Path::new(log_dir).join("konnectivity-server.log")
        } else {
            return None;
        };
        Some(FileSink {
            path,
            max_bytes: max_mb.saturating_mul(1 << 20),
            also_stderr: also,
        })
    }
}

/// A log file that starts over when it reaches its cap.
struct CappedFile {
    file: std::fs::File,
    written: u64,
    max_bytes: u64,
}

impl std::io::Write for CappedFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.max_bytes > 0 && self.written + buf.len() as u64 > self.max_bytes {
            self.file.set_len(0)?;
            std::io::Seek::seek(&mut self.file, std::io::SeekFrom::Start(0))?;
            self.written = 0;
        }
        let n = self.file.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

fn open_capped(sink: &FileSink) -> std::io::Result<std::sync::Mutex<CappedFile>> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&sink.path)?;
    let written = file.metadata()?.len();
    Ok(std::sync::Mutex::new(CappedFile {
        file,
        written,
        max_bytes: sink.max_bytes,
    }))
}

/// systemd sets JOURNAL_STREAM when our stderr is connected to the journal.
fn run_by_systemd() -> bool {
    std::env::var_os("JOURNAL_STREAM").is_some_and(|v| !v.is_empty())
}

/// Installs the global subscriber. Returns where logs go.
pub fn init(verbosity: u32, vmodule: &str, format: LogFormat, file: Option<FileSink>) -> String {
    let (filter, handle) = reload::Layer::new(log_filter(verbosity, vmodule));
    let _ = FILTER.set(handle);
    let want_journald = match format {
        LogFormat::Journald => true,
        LogFormat::Stderr => false,
        LogFormat::Auto => run_by_systemd() && file.is_none(),
    };
    // tracing-journald needs the journal socket; without it, fall back to stderr.
    let journald = want_journald
        .then(|| tracing_journald::layer().ok())
        .flatten()
        .map(|layer| {
            layer
                .with_field_prefix(None)
                .with_syslog_identifier("konnectivity-server".into())
        });
    let to_journal = journald.is_some();
    let mut file_error = None;
    let to_file = file.as_ref().and_then(|sink| match open_capped(sink) {
        Ok(writer) => Some(
            tracing_subscriber::fmt::layer()
                .with_writer(writer)
                .with_ansi(false)
                .boxed(),
        ),
        Err(e) => {
            file_error = Some(format!("cannot open log file {}: {e}", sink.path.display()));
            None
        }
    });
    let has_file = to_file.is_some();
    let stderr_too = file.as_ref().is_some_and(|f| f.also_stderr);
    let stderr = (!to_journal && (!has_file || stderr_too)).then(|| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .boxed()
    });
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(journald)
        .with(to_file)
        .with(stderr)
        .try_init();
    if let Some(error) = file_error {
        tracing::warn!("{error}; logging to stderr");
    }
    match (to_journal, &file, has_file) {
        (true, _, _) => "journald".into(),
        (_, Some(sink), true) => sink.path.display().to_string(),
        _ => "stderr".into(),
    }
}

/// Applies a new verbosity at once (reload).
pub fn set_verbosity(verbosity: u32, vmodule: &str) {
    if let Some(handle) = FILTER.get() {
        let _ = handle.reload(log_filter(verbosity, vmodule));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn klog_file_flags_pick_the_sink() {
        assert_eq!(
            FileSink::from_klog(true, "/x.log", "", 1, false),
            None,
            "logtostderr wins, as klog"
        );
        let sink = FileSink::from_klog(false, "", "/var/log/k", 2, true).unwrap();
        assert_eq!(
            sink.path,
            std::path::Path::new("/var/log/k/konnectivity-server.log")
        );
        assert_eq!(sink.max_bytes, 2 << 20);
        assert_eq!(FileSink::from_klog(false, "", "", 1, false), None);
    }

    #[test]
    fn the_file_starts_over_at_its_cap() {
        let dir = tempfile::tempdir().unwrap();
        let sink = FileSink {
            path: dir.path().join("log"),
            max_bytes: 100,
            also_stderr: false,
        };
        let file = open_capped(&sink).unwrap();
        let mut file = file.lock().unwrap();
        for _ in 0..10 {
            file.write_all(&[b'x'; 30]).unwrap();
        }
        let len = std::fs::metadata(&sink.path).unwrap().len();
        assert!(len <= 100, "{len}");
    }
}
