//! Process lifecycle: signals and logging.

use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// klog verbosity to a tracing level: 0-4 info (upstream runs at 4), 5 debug, 6+ trace.
pub fn level_for_verbosity(verbosity: u32) -> &'static str {
    match verbosity {
        0..=4 => "info",
        5 => "debug",
        _ => "trace",
    }
}

/// The log filter: RUST_LOG when set, else the -v level plus --vmodule's `module=N` entries.
pub fn log_filter(verbosity: u32, vmodule: &str) -> EnvFilter {
    if let Ok(filter) = EnvFilter::try_from_default_env() {
        return filter;
    }
    let mut directives = vec![format!(
        "konnectivity_server={lvl},warn,tower=warn,h2=warn,hyper=warn",
        lvl = level_for_verbosity(verbosity)
    )];
    for entry in vmodule.split(',').filter(|e| !e.is_empty()) {
        if let Some((module, level)) = entry.split_once('=') {
            if let Ok(level) = level.parse::<u32>() {
                directives.push(format!(
                    "konnectivity_server::{module}={}",
                    level_for_verbosity(level)
                ));
            }
        }
    }
    EnvFilter::new(directives.join(","))
}

/// Logs to stderr, readable.
pub fn init_logging(verbosity: u32, vmodule: &str) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(log_filter(verbosity, vmodule))
        .with_writer(std::io::stderr)
        .try_init();
}

/// Cancels the returned token on the first SIGTERM or SIGINT; a second one exits at once.
pub fn shutdown_on_signals() -> std::io::Result<CancellationToken> {
    use tokio::signal::unix::{signal, SignalKind};
    let token = CancellationToken::new();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let first = token.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("received a shutdown signal; draining (send it again to exit at once)");
        first.cancel();
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::warn!("second shutdown signal: exiting now");
        std::process::exit(1);
    });
    Ok(token)
}
