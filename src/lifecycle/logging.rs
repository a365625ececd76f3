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

/// systemd sets JOURNAL_STREAM when our stderr is connected to the journal.
fn run_by_systemd() -> bool {
    std::env::var_os("JOURNAL_STREAM").is_some_and(|v| !v.is_empty())
}

/// Installs the global subscriber. Returns where logs go.
pub fn init(verbosity: u32, vmodule: &str, format: LogFormat) -> &'static str {
    let (filter, handle) = reload::Layer::new(log_filter(verbosity, vmodule));
    let _ = FILTER.set(handle);
    let want_journald = match format {
        LogFormat::Journald => true,
        LogFormat::Stderr => false,
        LogFormat::Auto => run_by_systemd(),
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
    let stderr = (!to_journal).then(|| {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .boxed()
    });
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(journald)
        .with(stderr)
        .try_init();
    if to_journal {
        "journald"
    } else {
        "stderr"
    }
}

/// Applies a new verbosity at once (reload).
pub fn set_verbosity(verbosity: u32, vmodule: &str) {
    if let Some(handle) = FILTER.get() {
        let _ = handle.reload(log_filter(verbosity, vmodule));
    }
}
