use std::process::ExitCode;

use konnectivity_server::config::{Config, Options};
use konnectivity_server::{dev, lifecycle, server};

fn main() -> ExitCode {
    let mut options = match Options::parse_from_args(std::env::args_os()) {
        Ok(options) => options,
        Err(e) => {
            // clap prints help/version to stdout with exit 0, and errors with exit 2; upstream
            // exits 1 on bad flags.
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    lifecycle::init_logging(options.verbosity, &options.vmodule);
    if options.warn_on_channel_limit.is_some() {
        tracing::warn!("--warn-on-channel-limit is deprecated and has no effect");
    }
    let dev_setup = if options.dev {
        match dev::apply(&mut options) {
            Ok(setup) => Some(setup),
            Err(e) => {
                eprintln!("Error: {e:#}");
                return ExitCode::from(1);
            }
        }
    } else {
        None
    };
    let config = match Config::from_options(&options) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("Error: failed to validate server options with {e}");
            return ExitCode::from(1);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("Error: cannot start the async runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = runtime.block_on(async move {
        let listeners = server::Listeners::bind(&config).await?;
        if let Some(setup) = &dev_setup {
            eprint!("{}", setup.describe(options.agent_port));
        }
        let shutdown = lifecycle::shutdown_on_signals()
            .map_err(|e| anyhow::anyhow!("installing signal handlers: {e}"))?;
        server::run(config, listeners, shutdown).await?;
        Ok::<(), anyhow::Error>(())
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e:#}");
            ExitCode::from(1)
        }
    }
}
