//! konnectivity-agent: parses, validates, binds, and runs the agent as a service.

use std::process::ExitCode;

use konnectivity_server::agent::{self, AgentConfig, AgentListeners, AgentOptions, Snapshot};
use konnectivity_server::config::{layers, CommandLine, LogFormat};
use konnectivity_server::{lifecycle, logging};

const PROGRAM: &str = "konnectivity-agent";

/// Prints `message` and returns upstream's exit code for a bad start.
fn fail(message: impl std::fmt::Display) -> ExitCode {
    logging::finish();
    eprintln!("Error: {message}");
    ExitCode::from(1)
}

/// Writes out the log lines the writer thread still holds when `main` ends.
struct FinishLogs;

impl Drop for FinishLogs {
    fn drop(&mut self) {
        logging::finish();
    }
}

fn main() -> ExitCode {
    let _finish_logs = FinishLogs;
    start()
}

fn start() -> ExitCode {
    let cli = match CommandLine::<AgentOptions>::parse_as(std::env::args_os()) {
        Ok(cli) => cli,
        Err(e) => {
            if !e.use_stderr() {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            let text = e.to_string();
            eprint!("Error: {}", text.strip_prefix("error: ").unwrap_or(&text));
            return ExitCode::from(1);
        }
    };
    let mut options = match layers::load(&cli) {
        Ok(options) => options,
        Err(e) => return fail(e),
    };
    let log_format = match options.log_format.as_str() {
        "journald" => LogFormat::Journald,
        "stderr" => LogFormat::Stderr,
        _ => LogFormat::Auto,
    };
    let log_file = logging::FileSink::from_klog(
        PROGRAM,
        options.logtostderr,
        &options.log_file,
        &options.log_dir,
        options.log_file_max_size,
        options.alsologtostderr,
    );
    logging::init(PROGRAM, options.v, &options.vmodule, log_format, log_file);
    for warning in &options.load_warnings {
        tracing::warn!("{warning}");
    }
    if let Some(path) = options.write_config_to.clone() {
        let text = layers::to_toml(&options);
        let written = if path.as_os_str() == "-" {
            print!("{text}");
            Ok(())
        } else {
            std::fs::write(&path, text)
        };
        return match written {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => fail(format_args!("writing {}: {e}", path.display())),
        };
    }
    if options.dev {
        if let Err(e) = agent::dev::apply(&mut options) {
            return fail(e);
        }
    }
    let config = match AgentConfig::from_options(&options) {
        Ok(config) => config,
        Err(e) => return fail(format_args!("failed to validate agent options with {e}")),
    };
    let source = options
        .config
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "no config file".into());
    let snapshot = match Snapshot::build(config) {
        Ok(snapshot) => snapshot,
        Err(e) if options.check_config => {
            println!("configuration invalid ({source}): {e}");
            return ExitCode::from(1);
        }
        Err(e) => return fail(format_args!("failed to run proxy connection with {e}")),
    };
    if options.check_config {
        if let Some(path) = snapshot.config.token_path() {
            if let Err(e) = std::fs::read(path) {
                println!(
                    "configuration invalid ({source}): cannot read the token file {}: {e}",
                    path.display()
                );
                return ExitCode::from(1);
            }
        }
        println!("configuration OK ({source})");
        return ExitCode::SUCCESS;
    }
    if snapshot.config.admin_addr.ip().is_unspecified() && snapshot.config.enable_profiling {
        tracing::warn!(admin = %snapshot.config.admin_addr, "profiling is exposed on every interface: --admin-bind-address is empty");
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(format_args!("cannot start the async runtime: {e}")),
    };
    lifecycle::raise_nofile_limit();
    let result = runtime.block_on(async move {
        let listeners = AgentListeners::bind(&snapshot.config).await?;
        agent::service::run_service(cli, snapshot, listeners).await?;
        Ok::<(), anyhow::Error>(())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(format_args!("{e:#}")),
    }
}
